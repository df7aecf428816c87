#!/usr/bin/env bash
# The cluster bench's gateway-overhead part for two builds side by side:
# whole clusters of the build REV (built into a temporary directory) and
# of this tree's bin/cellfork, alternating, ROUNDS rounds (3).
#   scripts/bench-gateway-ab.sh REV [ROUNDS]
set -euo pipefail
rev=${1:?usage: scripts/bench-gateway-ab.sh REV [ROUNDS]}
rounds=${2:-3}
cd "$(dirname "$0")/.."
before=$(mktemp -d)
trap 'rm -rf "$before"' EXIT
git archive "$rev" | tar -x -C "$before"
(cd "$before" && make -s build)
make -s build
for round in $(seq 1 "$rounds"); do
  for b in "$before/bin/cellfork" bin/cellfork; do
    echo "### round $round: $b, load $(cut -d' ' -f1-3 /proc/loadavg)"
    go run ./bench/cluster -bin "$b" -template-dir "${TEMPLATE_DIR:-/var/lib/cellfork/templates}" -only overhead | grep -E '^\|'
  done
done
