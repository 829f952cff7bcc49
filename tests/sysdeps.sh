#!/usr/bin/env bash
# Installs the system packages the test suite needs (PostgreSQL, OpenSSH, Chromium, a CJK font, a C++ toolchain, curl and jq), only when missing (we are root on these machines).
# cmake, ninja, g++ and binutils build llama-server from source (tuneloop llamacpp build) and scan it (objdump);
# qemu-user runs it on an emulated AVX2-only CPU in tests/test_llamacpp_cpu.py.
set -euo pipefail
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# a CJK font so the dashboard and reports render Chinese (goal names, chat) instead of boxes
fc-list 2>/dev/null | grep -qi "Noto Sans CJK" || need+=(fonts-noto-cjk)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v objdump >/dev/null 2>&1 || need+=(binutils)
command -v qemu-x86_64 >/dev/null 2>&1 || need+=(qemu-user)
# curl and jq: the README's quick start, which tests/test_quickstart.py runs as written
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v jq >/dev/null 2>&1 || need+=(jq)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
