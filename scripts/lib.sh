# lib.sh: shared by test.sh and bench.sh. Source it, then call
# start_test_daemon [extra serve flags...]. It exports CELLFORK_URL/KEY and
# the E2B_* variables, and stops the daemon and removes its data on exit.
# CELLFORK_BIN names the daemon binary (default bin/cellfork; its agent is
# the one beside it).
DATA_DIR=${DATA_DIR:-/var/lib/cellfork}

start_test_daemon() {
  TEST_TMP=$(mktemp -d /tmp/cellfork-test.XXXXXX)
  local port key
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  key="test-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  CELLFORK_API_KEY="$key" "${CELLFORK_BIN:-bin/cellfork}" serve --addr "127.0.0.1:$port" --data-dir "$TEST_TMP/data" \
    --template-dir "$DATA_DIR/templates" "$@" > "$TEST_TMP/daemon.log" 2>&1 &
  TEST_DAEMON=$!
  trap stop_test_daemon EXIT
  for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fsS "http://127.0.0.1:$port/health" >/dev/null || { tail -n 20 "$TEST_TMP/daemon.log"; return 1; }
  export CELLFORK_URL="http://127.0.0.1:$port" CELLFORK_API_KEY="$key"
  export E2B_API_URL="$CELLFORK_URL" E2B_SANDBOX_URL="$CELLFORK_URL" E2B_API_KEY="$key"
}

# terminate_test_daemon stops the daemon (it destroys its pool; sandboxes
# would survive it, as in production) and keeps its data for inspection.
terminate_test_daemon() {
  kill -TERM "$TEST_DAEMON" 2>/dev/null || true
  wait "$TEST_DAEMON" 2>/dev/null || true
}

# stop_test_daemon kills what the daemon still runs (sandboxes outlive a
# daemon by design, and its data directory is about to go), stops it and
# removes its data.
stop_test_daemon() {
  if kill -0 "$TEST_DAEMON" 2>/dev/null; then
    for id in $(curl -fsS -H "X-API-KEY: $CELLFORK_API_KEY" "$CELLFORK_URL/v2/sandboxes?state=running,paused" 2>/dev/null |
      python3 -c 'import json,sys; print(" ".join(s["sandboxID"] for s in json.load(sys.stdin)))' 2>/dev/null); do
      curl -fsS -X DELETE -H "X-API-KEY: $CELLFORK_API_KEY" "$CELLFORK_URL/sandboxes/$id" >/dev/null 2>&1 || true
    done
  fi
  terminate_test_daemon
  for _ in 1 2 3; do umount "$TEST_TMP/data/runsc/null-netns" 2>/dev/null || true; done
  rm -rf "$TEST_TMP"
}
