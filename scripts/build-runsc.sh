#!/usr/bin/env bash
# build-runsc.sh [--upto NNNN | --only NNNN,... | --none]: build runsc from
# the pinned gVisor module source with cellfork's patches
# (patches/gvisor/NNNN-*.patch, in order) and its seccomp filters
# precompiled. Progress goes to stderr; the last line on stdout is the build
# directory:
#   <cache>/<build id>/runsc     the static binary, stamped with the build id,
#                                with its sidecars in gvisor-bin/ (the sentry
#                                is runsc itself; the prewarmer is ours), so
#                                it runs from there as installed
#   <cache>/<build id>/src/      the patched source tree it was built from
#                                (gVisor's unit tests of the patched packages
#                                run there: scripts/test-gvisor.sh)
#   <cache>/<build id>/build-id  what `runsc --version` says
# Builds are cached per build id (the pinned version, the seccomp generator
# and the selected patches' names and contents), so switching between patch
# sets never rebuilds one twice. --upto and --only select a subset, for
# side-by-side comparisons (bench/runsc_ab.py). The cache is
# $CELLFORK_BUILD_CACHE, default /var/cache/cellfork/runsc.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
CACHE=${CELLFORK_BUILD_CACHE:-/var/cache/cellfork/runsc}
say() { printf '    runsc: %s\n' "$*" >&2; }
die() { printf 'build-runsc: %s\n' "$*" >&2; exit 1; }

all=(patches/gvisor/[0-9][0-9][0-9][0-9]-*.patch)
[ -e "${all[0]}" ] || all=()
sel=("${all[@]}")
case "${1:-}" in
  "") ;;
  --none) sel=() ;;
  --upto)
    [ -n "${2:-}" ] || die "--upto needs a patch number"
    sel=()
    for p in "${all[@]}"; do
      n=$(basename "$p"); n=${n%%-*}
      [ "$((10#$n))" -le "$((10#$2))" ] && sel+=("$p")
    done ;;
  --only)
    [ -n "${2:-}" ] || die "--only needs patch numbers"
    sel=()
    IFS=, read -ra want <<< "$2"
    for w in "${want[@]}"; do
      m=(patches/gvisor/"$(printf '%04d' "$((10#$w))")"-*.patch)
      [ -e "${m[0]}" ] || die "no patch numbered $w in patches/gvisor"
      sel+=("${m[0]}")
    done ;;
  *) die "usage: scripts/build-runsc.sh [--upto NNNN | --only NNNN,... | --none]" ;;
esac

# The build id: what the binary is made of. It is runsc's version string, so
# the sentry refuses to restore an image another build wrote (gVisor keeps
# the writer's version in the image's metadata and compares it at restore),
# and the daemon puts it in its warm images' key.
hash=$( {
  echo "$RUNSC_VERSION"
  cat internal/runtime/gvisor/seccompgen/gen.go internal/runtime/gvisor/prewarmer/prewarmer.c
  for p in "${sel[@]}"; do echo "patch $(basename "$p")"; cat "$p"; done
} | sha256sum | cut -c1-12)
id="$RUNSC_VERSION+cellfork.$hash"
dir="$CACHE/$id"

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9 # two setups at once build once
if [ -x "$dir/runsc" ] && [ "$(cat "$dir/build-id" 2>/dev/null)" = "$id" ]; then
  say "cached build $id (${#sel[@]} patches)"
  echo "$dir"
  exit 0
fi

command -v go >/dev/null || die "Go 1.24+ is required (https://go.dev/doc/install)"
say "building $id: gVisor $RUNSC_VERSION + ${#sel[@]} patches, seccomp filters precompiled (static, about two minutes of both CPUs)"
tmp="$dir.tmp"
rm -rf "$tmp" "$dir"
mkdir -p "$tmp"
# Outside this module, so that its go.mod is not touched.
mod=$(cd "$tmp" && go mod download -json "gvisor.dev/gvisor@$RUNSC_VERSION") || die "downloading gvisor.dev/gvisor@$RUNSC_VERSION failed"
src=$(python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["Dir"])' <<< "$mod")
cp -r "$src" "$tmp/src"
chmod -R u+w "$tmp/src"
for p in "${sel[@]}"; do
  say "applying $(basename "$p")"
  # Exactly (no fuzz): a patch that no longer fits the pinned source must be
  # redone, not half-applied.
  if ! out=$(patch -d "$tmp/src" -p1 --forward --batch --fuzz=0 --dry-run < "$p" 2>&1); then
    die "patch $(basename "$p") does not apply to gVisor $RUNSC_VERSION:
$out"
  fi
  patch -d "$tmp/src" -p1 --forward --batch --fuzz=0 --quiet < "$p" >&2
done
say "precompiling seccomp filters"
cp internal/runtime/gvisor/seccompgen/gen.go "$tmp/src/cellfork_seccompgen.go"
(cd "$tmp/src" && CGO_ENABLED=0 go run cellfork_seccompgen.go) >&2 || die "precompiling seccomp filters failed"
rm "$tmp/src/cellfork_seccompgen.go"
say "compiling runsc"
(cd "$tmp/src" && CGO_ENABLED=0 go build -trimpath \
  -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$id" -o "$tmp/runsc" ./runsc) >&2 || die "compiling runsc failed"
got=$("$tmp/runsc" --version) || die "the built runsc does not run"
got=${got%%$'\n'*}
[ "$got" = "runsc version $id" ] || die "the built runsc says \"$got\", not \"runsc version $id\""
mkdir "$tmp/gvisor-bin"
ln "$tmp/runsc" "$tmp/gvisor-bin/gvisor_sentry"
cc -O2 -o "$tmp/gvisor-bin/gvisor-sentry-prewarmer" internal/runtime/gvisor/prewarmer/prewarmer.c || die "building the prewarmer sidecar failed"
echo "$id" > "$tmp/build-id"
printf '%s\n' "${sel[@]##*/}" > "$tmp/patches"
mv "$tmp" "$dir"
say "built $id"
echo "$dir"
