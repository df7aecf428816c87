#!/usr/bin/env bash
# bench-compare.sh REF [--suite core|fork|noisy] [--rounds N] [suite options]:
# one benchmark suite against two builds in one run: REF (any git ref, built
# in a temporary worktree) and the working tree (bin/, `make build` first).
# Rounds alternate between the builds (REF, tree, REF, tree...), each
# against a throwaway daemon of its own, so that load on the machine falls
# on both alike. Prints each round's tables under the build's name; paste
# them into docs/benchmarks.md with this command line.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/bench-compare.sh REF [--suite core|fork|noisy] [--rounds N] [suite options]" >&2; exit 2; }
ref=$1; shift
suite=core rounds=2
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) suite=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$suite" in core) script=bench/bench.py ;; fork) script=bench/fork.py ;; noisy) script=bench/noisy.py ;;
  *) echo "unknown suite $suite" >&2; exit 2 ;; esac
[ -x bin/cellfork ] || { echo "bin/cellfork missing: run make build" >&2; exit 1; }
before=$(mktemp -d /tmp/cellfork-before.XXXXXX)
cleanup() { git worktree remove --force "$before" >/dev/null 2>&1 || rm -rf "$before"; }
trap cleanup EXIT
echo "==> building $ref ($(git rev-parse --short "$ref")) in $before"
git worktree add --detach -q "$before" "$ref"
(cd "$before" && make -s build >/dev/null)
tree="working tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +changes))"
for i in $(seq 1 "$rounds"); do
  for build in before tree; do
    if [ "$build" = before ]; then bin="$before/bin/cellfork" name="$ref ($(git rev-parse --short "$ref"))"; else bin=bin/cellfork name=$tree; fi
    echo
    echo "### round $i: $name (load $(cut -d' ' -f1-3 /proc/loadavg))"
    (
      export CELLFORK_BIN="$bin"
      . scripts/lib.sh
      start_test_daemon
      export CELLFORK_DATA_DIR="$TEST_TMP/data" CELLFORK_DAEMON_LOG="$TEST_TMP/daemon.log"
      .venv/bin/python "$script" "${args[@]}"
    )
  done
done
