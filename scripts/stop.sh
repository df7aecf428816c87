#!/usr/bin/env bash
# stop.sh DATA_DIR [--keep-sandboxes]: kill the daemon's sandboxes (unless
# told to keep them for the next daemon to adopt) and stop the daemon.
set -uo pipefail
cd "$(dirname "$0")/.."
data=$1 keep=${2:-}
pid=$(cat "$data/daemon.lock" 2>/dev/null | tr -d '[:space:]')
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null || ! grep -q "cellfork" "/proc/$pid/cmdline" 2>/dev/null; then
  echo "cellfork daemon is not running"
  exit 0
fi
if [ "$keep" != "--keep-sandboxes" ]; then
  addr=$(tr '\0' '\n' < "/proc/$pid/cmdline" | grep -A1 -- '^--addr$' | tail -n 1)
  key=${CELLFORK_API_KEY:-$(cat "$data/api-key" 2>/dev/null)}
  CELLFORK_URL="http://${addr:-127.0.0.1:3000}" CELLFORK_API_KEY="${key%%,*}" bin/cellfork sandbox list --json 2>/dev/null |
    python3 -c 'import json,sys; [print(s["sandboxID"]) for s in json.load(sys.stdin)]' 2>/dev/null |
    while read -r id; do
      CELLFORK_URL="http://${addr:-127.0.0.1:3000}" CELLFORK_API_KEY="${key%%,*}" bin/cellfork sandbox kill "$id" >/dev/null && echo "killed sandbox $id"
    done
fi
kill -TERM "$pid"
for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && { echo "daemon $pid did not stop; sending SIGKILL"; kill -KILL "$pid"; }
echo "cellfork daemon stopped"
