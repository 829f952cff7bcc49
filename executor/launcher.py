"""The target-side launcher: a small POSIX sh script copied to every local/ssh target.

It is the only thing that starts processes on a target. Under `flock` it checks the caller's
lease epoch against the target's epoch file and refuses a stale one, so a paused or partitioned
executor can launch nothing. It fails closed: an epoch argument or an epoch file that is empty or not a number
is refused (rc 65), and so is any locked action where `flock` is absent (rc 69). Detached runs live in a run directory: `mkdir` is the atomic claim,
`setsid nohup ... </dev/null >log 2>&1 &`, then pid, rc by atomic rename, then done. Every start,
end and refusal is appended to `launch.log` (the target-side history the overlap tests read).

    ROOT/epoch            highest epoch seen          ROOT/launch.log   start/end/refused lines
    ROOT/runs/KEY/        epoch pid log rc done out/  ROOT/svc/NAME/    station pid log rc done files
"""
from __future__ import annotations

import hashlib

STALE_EPOCH_RC = 75
ALREADY_CLAIMED_RC = 73
BAD_EPOCH_RC = 65  # the caller's epoch or the target's epoch file is missing, empty or not a number
NO_FLOCK_RC = 69  # `flock` is absent: no fence, so no launch

SCRIPT = r'''#!/bin/sh
# tuneloop launcher (installed by the executor). usage: launcher.sh ROOT EPOCH ACTION ARGS...
set -u
[ $# -ge 3 ] || { echo "usage: launcher.sh ROOT EPOCH ACTION ARGS..." >&2; exit 64; }
ROOT=$1; EPOCH=$2; ACTION=$3; shift 3
numeric() { case "$1" in ''|*[!0-9]*) return 1 ;; *) return 0 ;; esac; }
numeric "$EPOCH" || { echo "bad epoch: the caller's epoch '$EPOCH' is not a number; refused $ACTION" >&2; exit 65; }
mkdir -p "$ROOT/runs" "$ROOT/svc"
now() { date +%s.%N; }
log() { printf '%s %s\n' "$(now)" "$*" >> "$ROOT/launch.log"; }
lock() {  # without flock there is no fence: refuse rather than run unfenced
  command -v flock >/dev/null 2>&1 || { log "refused $ACTION no-flock"; echo "no flock on this target (util-linux): refused $ACTION" >&2; exit 69; }
  exec 9>"$ROOT/.lock"
  flock -x 9 || { echo "flock failed on $ROOT/.lock: refused $ACTION" >&2; exit 69; }
}
fence() {
  if [ -e "$ROOT/epoch" ]; then
    cur=$(cat "$ROOT/epoch" 2>/dev/null | tr -d ' \n')
    if ! numeric "$cur"; then  # empty or garbage: the fence cannot be judged, so it holds (fails closed)
      log "refused $ACTION $1 epoch=$EPOCH bad-epoch-file"
      echo "bad epoch file: $ROOT/epoch is empty or not a number; refused $ACTION $1 (restore it from the store's lease epoch)" >&2
      exit 65
    fi
  else
    cur=0
  fi
  if [ "$EPOCH" -lt "$cur" ]; then
    log "refused $ACTION $1 epoch=$EPOCH current=$cur"
    echo "stale epoch: $EPOCH < $cur on this target (a newer lease holder exists); refused $ACTION $1" >&2
    exit 75
  fi
  if [ "$EPOCH" -gt "$cur" ]; then printf '%s\n' "$EPOCH" > "$ROOT/epoch.tmp" && mv -f "$ROOT/epoch.tmp" "$ROOT/epoch"; fi
}
detach() {  # DIR KIND NAME -- ARGV...: own session, markers pid / rc (atomic rename) / done
  dir=$1; kind=$2; name=$3; shift 4
  rm -f "$dir/rc" "$dir/done"
  TL_ROOT=$ROOT TL_KIND=$kind TL_NAME=$name TL_EPOCH=$EPOCH setsid nohup sh -c '
    cd "$0" || exit 70
    "$@"
    rc=$?
    printf "%s %s %s epoch=%s rc=%s\n" "$(date +%s.%N)" "end-$TL_KIND" "$TL_NAME" "$TL_EPOCH" "$rc" >> "$TL_ROOT/launch.log"
    printf "%s\n" "$rc" > rc.tmp && mv -f rc.tmp rc
    printf "{\"rc\": %s}\n" "$rc" > done.tmp && mv -f done.tmp done
  ' "$dir" "$@" </dev/null >"$dir/log" 2>&1 9>&- &
  printf '%s\n' "$!" > "$dir/pid.tmp" && mv -f "$dir/pid.tmp" "$dir/pid"
  cat "$dir/pid"
}
stop_dir() {  # stop the process group recorded in DIR/pid, TERM then KILL
  pid=$(cat "$1/pid" 2>/dev/null || true)
  [ -n "$pid" ] || return 0
  kill -s TERM -- "-$pid" 2>/dev/null || return 0
  i=0
  while [ "$(alive "$1")" = 1 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  kill -s KILL -- "-$pid" 2>/dev/null || true
}
alive() {  # a zombie (exited, not yet reaped) is not alive
  pid=$(cat "$1/pid" 2>/dev/null || true)
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || { echo 0; return; }
  case "$(ps -o stat= -p "$pid" 2>/dev/null)" in Z*) echo 0 ;; *) echo 1 ;; esac
}
show() { [ -f "$1" ] && tr -d '\n' < "$1" || printf -- '-'; }
case "$ACTION" in
  fence) lock; fence "-" ;;
  run)
    key=$1; shift
    lock; fence "$key"
    mkdir "$ROOT/runs/$key" 2>/dev/null || { log "refused run $key epoch=$EPOCH already-claimed"; echo "run $key already claimed on this target" >&2; exit 73; }
    mkdir "$ROOT/runs/$key/out"
    printf '%s\n' "$EPOCH" > "$ROOT/runs/$key/epoch"
    log "start-run $key epoch=$EPOCH"
    detach "$ROOT/runs/$key" run "$key" "$@" ;;
  service)
    name=$1; station=$2; shift 2
    lock; fence "$name"
    mkdir -p "$ROOT/svc/$name"
    stop_dir "$ROOT/svc/$name"
    printf '%s\n' "$station" > "$ROOT/svc/$name/station"
    log "start-service $name epoch=$EPOCH station=$station"
    detach "$ROOT/svc/$name" service "$name" "$@" ;;
  stop)
    name=$1
    lock; fence "$name"
    stop_dir "$ROOT/svc/$name"
    rm -f "$ROOT/svc/$name/station"
    log "stop-service $name epoch=$EPOCH" ;;
  poll)
    d="$ROOT/runs/$1"
    [ -d "$d" ] || { echo "claimed=0"; exit 0; }
    echo "claimed=1 pid=$(show "$d/pid") alive=$(alive "$d") rc=$(show "$d/rc") done=$([ -f "$d/done" ] && echo 1 || echo 0) epoch=$(show "$d/epoch")" ;;
  svcstate)
    d="$ROOT/svc/$1"
    [ -d "$d" ] || { echo "station=- pid=- alive=0 rc=-"; exit 0; }
    echo "station=$(show "$d/station") pid=$(show "$d/pid") alive=$(alive "$d") rc=$(show "$d/rc")" ;;
  *) echo "unknown action $ACTION" >&2; exit 64 ;;
esac
'''

SCRIPT_HASH = hashlib.sha256(SCRIPT.encode()).hexdigest()[:12]


def script_name() -> str:
    """Versioned file name, so a changed launcher never mixes with an old copy on a target."""
    return f"launcher-{SCRIPT_HASH}.sh"


def parse_kv(line: str) -> dict[str, str]:
    """`k=v k=v` output of poll/svcstate -> dict; '-' means absent."""
    out: dict[str, str] = {}
    for part in line.strip().split():
        k, _, v = part.partition("=")
        out[k] = v
    return out
