#!/usr/bin/env bash
# demo.sh DATA_DIR ADDR: (re)start the daemon in the background, run the
# quickstart against it, and leave it running.
set -euo pipefail
cd "$(dirname "$0")/.."
data=$1 addr=$2
url="http://$addr"
log="$data/daemon.log"
mkdir -p "$data"

bash scripts/stop.sh "$data" --keep-sandboxes >/dev/null
echo "==> starting cellfork daemon on $url (log: $log)"
setsid bin/cellfork serve --addr "$addr" --data-dir "$data" >>"$log" 2>&1 < /dev/null &
for _ in $(seq 1 300); do
  curl -fsS "$url/health" >/dev/null 2>&1 && break
  kill -0 $! 2>/dev/null || { echo "daemon failed to start; last lines of $log:"; tail -n 20 "$log"; exit 1; }
  sleep 0.2
done
curl -fsS "$url/health" >/dev/null || { echo "daemon did not answer on $url"; exit 1; }

key=${CELLFORK_API_KEY:-$(cat "$data/api-key")}
key=${key%%,*}
echo "==> running examples/quickstart.py"
CELLFORK_URL="$url" CELLFORK_API_KEY="$key" .venv/bin/python examples/quickstart.py
cat <<MSG

cellfork is running.
  URL:      $url
  API key:  $key
  our SDK:  export CELLFORK_URL=$url CELLFORK_API_KEY=$key
  E2B SDKs: export E2B_API_URL=$url E2B_SANDBOX_URL=$url E2B_API_KEY=$key
  CLI:      CELLFORK_API_KEY=$key bin/cellfork sandbox list
  stop:     make stop
MSG
