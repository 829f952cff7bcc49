#!/usr/bin/env bash
# Installs the system packages the test suite needs (PostgreSQL, OpenSSH, Chromium, a CJK font), only when missing (we are root on these machines).
set -euo pipefail
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# a CJK font so the dashboard and reports render Chinese (goal names, chat) instead of boxes
fc-list 2>/dev/null | grep -qi "Noto Sans CJK" || need+=(fonts-noto-cjk)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
