#!/usr/bin/env bash
# Starts the services the tests need and writes their addresses to .tuneloop-test-env:
# a private PostgreSQL cluster on 127.0.0.1 (its own data dir, so it never touches a system cluster).
# sshd is started by the SSH tests themselves (each with its own host key and port).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pgdir=/var/tmp/tuneloop-pg
port=${TUNELOOP_PG_PORT:-55432}
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
case "${1:-start}" in
start)
  if ! id postgres >/dev/null 2>&1; then useradd -r -m postgres; fi
  if [ ! -f "$pgdir/PG_VERSION" ]; then
    mkdir -p "$pgdir" && chown postgres "$pgdir"
    su postgres -s /bin/sh -c "$pgbin/initdb -D $pgdir -A trust -U postgres >/dev/null"
  fi
  if ! su postgres -s /bin/sh -c "$pgbin/pg_ctl -D $pgdir status" >/dev/null 2>&1; then
    su postgres -s /bin/sh -c "$pgbin/pg_ctl -D $pgdir -l $pgdir/log -w -o '-p $port -k /tmp -h 127.0.0.1 -c max_connections=200' start" >/dev/null
  fi
  su postgres -s /bin/sh -c "$pgbin/psql -h 127.0.0.1 -p $port -U postgres -tAc \"select 1 from pg_database where datname='tuneloop_test'\"" | grep -q 1 \
    || su postgres -s /bin/sh -c "$pgbin/createdb -h 127.0.0.1 -p $port -U postgres tuneloop_test"
  echo "export TUNELOOP_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:$port/tuneloop_test" > "$root/.tuneloop-test-env"
  echo "postgresql on 127.0.0.1:$port"
  ;;
stop)
  su postgres -s /bin/sh -c "$pgbin/pg_ctl -D $pgdir -m fast stop" || true
  ;;
esac
