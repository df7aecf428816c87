#!/usr/bin/env bash
# bench.sh [--suite all|core|fork] [--quick] [suite options]: run the
# benchmark against a throwaway daemon and print Markdown tables (paste them
# into docs/benchmarks.md with this command).
#   core: bench/bench.py (create, run_code, exec vs raw runsc run/exec)
#   fork: bench/fork.py  (pool, snapshot, create-from-snapshot, fork,
#         rollback, pause/resume, density vs raw runsc checkpoint/restore)
#   noisy: bench/noisy.py (a victim's hot run_code while a neighbour abuses
#         CPU, memory, processes, disk; target p99 <= 3x quiet)
#   cluster: bench/cluster (placement against 1..10,000 hosts, the gateway's
#         cost against the host, creates, 10,000 idle connections) on a
#         one-machine cluster; not part of "all"
#   languages: bench/languages.py (the code interpreter's kernels: start,
#         hot run_code, memory; not part of "all")
#   runsc: bench/runsc_ab.py (two runsc builds side by side: --a DIR --b DIR,
#         build directories from scripts/build-runsc.sh; not part of all)
#   profile: bench/runsc_profile.py (one build's sentry CPU profile over n
#         restores, and its per-type decode stats: --build DIR; --checkpoints K
#         adds K leave-running checkpoints of each, profiled; not part of all)
#   templates: bench/templates.py (a custom template built cold and with a
#         warm cache; create and first request beside base)
# Options other than --quick belong to one suite; pass them with --suite.
set -euo pipefail
cd "$(dirname "$0")/.."
suite=all
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) suite=${2:-}; shift 2 ;;
    --suite=*) suite=${1#*=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$suite" in
  all|core|fork|noisy|templates|languages|runsc|profile) ;;
  cluster) exec go run ./bench/cluster -bin bin/cellfork -template-dir "${DATA_DIR:-/var/lib/cellfork}/templates" "${args[@]}" ;;
  *) echo "usage: scripts/bench.sh [--suite all|core|fork|noisy|templates|cluster|languages|runsc|profile] [--quick] [suite options]" >&2; exit 2 ;;
esac
. scripts/lib.sh
if [ "$suite" = runsc ] || [ "$suite" = profile ]; then
  # A bundle to copy and a quiet daemon: one ready sandbox, nothing else.
  start_test_daemon --pool-ready 1 --pool-shells 0 --standby-snapshots 0
else
  start_test_daemon
fi
export CELLFORK_DATA_DIR="$TEST_TMP/data" CELLFORK_DAEMON_LOG="$TEST_TMP/daemon.log"
rc=0
if [ "$suite" = all ] || [ "$suite" = core ]; then .venv/bin/python bench/bench.py "${args[@]}" || rc=$?; echo; fi
if [ "$suite" = all ] || [ "$suite" = fork ]; then .venv/bin/python bench/fork.py "${args[@]}" || rc=$?; echo; fi
if [ "$suite" = all ] || [ "$suite" = noisy ]; then .venv/bin/python bench/noisy.py "${args[@]}" || rc=$?; echo; fi
if [ "$suite" = all ] || [ "$suite" = templates ]; then .venv/bin/python bench/templates.py "${args[@]}" || rc=$?; fi
if [ "$suite" = languages ]; then .venv/bin/python bench/languages.py "${args[@]}" || rc=$?; fi
if [ "$suite" = runsc ]; then .venv/bin/python bench/runsc_ab.py "${args[@]}" || rc=$?; fi
if [ "$suite" = profile ]; then .venv/bin/python bench/runsc_profile.py "${args[@]}" || rc=$?; fi
exit $rc
