#!/usr/bin/env bash
# bench-patches.sh [--n N] [only...]: measure each runsc patch (and each
# flag or host setting tried) alone, side by side with the build before it,
# in one run each (scripts/bench.sh --suite runsc), and print the tables.
# The builds come from scripts/build-runsc.sh (cached; the first run builds
# each subset once, about two and a half minutes each). Names of steps to run
# may be given (default: all):
#   loader      0001 loader-per-cpu        none      vs --upto 1
#   background  runsc restore --background --upto 1  vs the same + flag
#   thp         host shmem huge pages      --upto 1  vs the same + THP
#   zeroscan    0002 zero-scan-holes       --upto 1  vs --upto 2
#   gc          0003 gc-pause              --upto 2  vs --upto 3
#   cow         0004 image-cow             --upto 3  vs --upto 4
#   sync        0006 save-sync-written     --upto 4  vs --upto 6 (0005 only logs)
#   heap        0007 release-heap          --upto 6  vs --upto 7
#   ws          0008 working-set           --upto 7  vs --upto 8
#   diff        0009 diff-prefetch         --upto 8  vs --upto 9 (restores of a diff image)
#   fdtable     0010 fd-table              --upto 9  vs --upto 10
#   pipeline    0011 decode-pipeline       --upto 10 vs --upto 11
#   stubs       0012 stub-pool             --upto 11 vs --upto 12
#   premap      0013 premap                --upto 12 vs --upto 13 (a pooled sandbox's first print(1))
#   inherit     0014 premap-inherit        --upto 13 vs --upto 14 (a diff image's /init and first run_code)
#   background-cow  --background on the full set
set -euo pipefail
cd "$(dirname "$0")/.."
n=8
if [ "${1:-}" = --n ]; then n=$2; shift 2; fi
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(loader background thp zeroscan gc cow sync heap ws diff fdtable pipeline stubs premap inherit background-cow)

b() { scripts/build-runsc.sh "$@" | tail -n 1; }
full=$(b)
run() { # title a b [extra args...]
  local title=$1 a=$2 bb=$3; shift 3
  echo "## $title"
  echo
  echo "\`scripts/bench.sh --suite runsc --a <$(cat "$a/build-id" | sed 's/.*+//')> --b <$(cat "$bb/build-id" | sed 's/.*+//')> --n $n $*\`"
  echo
  # The daemon only lends its bundle: it runs the full build.
  CELLFORK_RUNSC="$full/runsc" bash scripts/bench.sh --suite runsc --a "$a" --b "$bb" --n "$n" "$@"
  echo
}
for s in "${steps[@]}"; do
  case "$s" in
    loader) run "0001 loader-per-cpu" "$(b --none)" "$(b --upto 1)" ;;
    background) run "runsc restore --background" "$(b --upto 1)" "$(b --upto 1)" --b-flags=--background ;;
    thp) run "host shmem huge pages (shmem_enabled=advise, defrag=defer)" "$(b --upto 1)" "$(b --upto 1)" --thp b ;;
    zeroscan) run "0002 zero-scan-holes" "$(b --upto 1)" "$(b --upto 2)" ;;
    gc) run "0003 gc-pause" "$(b --upto 2)" "$(b --upto 3)" ;;
    cow) run "0004 image-cow" "$(b --upto 3)" "$(b --upto 4)" ;;
    sync) run "0006 save-sync-written (0005 save-timing only logs)" "$(b --upto 4)" "$(b --upto 6)" ;;
    heap) run "0007 release-heap" "$(b --upto 6)" "$(b --upto 7)" ;;
    ws) run "0008 working-set" "$(b --upto 7)" "$(b --upto 8)" ;;
    diff) run "0009 diff-prefetch" "$(b --upto 8)" "$(b --upto 9)" --ops diff,restore,pss ;;
    fdtable) run "0010 fd-table" "$(b --upto 9)" "$(b --upto 10)" --ops restore,diff ;;
    pipeline) run "0011 decode-pipeline" "$(b --upto 10)" "$(b --upto 11)" --ops restore,diff ;;
    stubs) run "0012 stub-pool" "$(b --upto 11)" "$(b --upto 12)" --ops restore,diff,pss ;;
    premap) run "0013 premap" "$(b --upto 12)" "$(b --upto 13)" --ops pooled,restore ;;
    inherit) run "0014 premap-inherit" "$(b --upto 13)" "$(b --upto 14)" --ops diffinit,diff ;;
    background-cow) run "runsc restore --background, with every patch" "$full" "$full" --b-flags=--background ;;
    *) echo "bench-patches: unknown step $s" >&2; exit 2 ;;
  esac
done
