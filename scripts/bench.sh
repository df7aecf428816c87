#!/usr/bin/env bash
# bench.sh [bench.py args]: run the benchmark against a throwaway daemon and
# print Markdown tables (paste them into docs/benchmarks.md with this command).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
start_test_daemon
.venv/bin/python bench/bench.py "$@"
