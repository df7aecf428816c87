#!/usr/bin/env bash
# test-gvisor.sh: run gVisor's own unit tests of the packages cellfork's
# patches change, and cellfork's tests of the patches
# (patches/gvisor/tests/*.patch), against the patched source tree the
# installed runsc was built from (scripts/build-runsc.sh keeps it). The
# tests are laid over that tree with `go test -overlay`, so it stays as
# built. Only the packages the test patches add tests to are tested.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { printf 'test-gvisor: %s\n' "$*" >&2; exit 1; }

build=$(scripts/build-runsc.sh) # cached: builds only if the patches changed
src="$build/src"
tmp=$(mktemp -d /tmp/cellfork-gvisor-tests.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/files"
for p in patches/gvisor/tests/[0-9][0-9][0-9][0-9]-*.patch; do
  patch -d "$tmp/files" -p1 --forward --batch --fuzz=0 --quiet < "$p" || die "test patch $(basename "$p") does not apply"
done
# The overlay: each test file at its place in the source tree.
python3 - "$src" "$tmp/files" > "$tmp/overlay.json" <<'EOF'
import json, os, sys
src, files = sys.argv[1:]
replace = {}
for d, _, names in os.walk(files):
    for n in names:
        rel = os.path.relpath(os.path.join(d, n), files)
        replace[os.path.join(src, rel)] = os.path.join(d, n)
print(json.dumps({"Replace": replace}))
EOF
pkgs=$(cd "$tmp/files" && find . -name '*_test.go' -printf '%h\n' | sort -u | sed 's|^\./|./|')
[ -n "$pkgs" ] || die "no tests in patches/gvisor/tests"
echo "gVisor unit tests ($(cat "$build/build-id")):" $pkgs
# -trimpath: the same flags as the build, so its compiled packages are reused.
# -vet=off: vet cannot read a package the overlay adds (contexttest).
(cd "$src" && CGO_ENABLED=0 go test -trimpath -vet=off -count=1 -overlay "$tmp/overlay.json" $pkgs)
