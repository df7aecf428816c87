#!/usr/bin/env bash
# setup.sh: install what cellfork needs on a Debian 12 host, idempotently.
# Installs: Debian packages, a static runsc built from the pinned gVisor with
# cellfork's patches (scripts/build-runsc.sh) and its sidecars, a Python
# virtualenv (.venv) with the test and SDK dependencies, and the JS
# conformance suite's npm packages (needs Node.js >= 20.18.1).
set -euo pipefail
cd "$(dirname "$0")/.."

LIBDIR=${CELLFORK_LIBDIR:-/usr/local/lib/cellfork}
step() { printf '\033[1m==> %s\033[0m\n' "$*"; }

[ "$(id -u)" = 0 ] || { echo "setup: run as root (cellfork manages network namespaces and gVisor sandboxes)" >&2; exit 1; }

need_pkgs=()
# postgresql-15: the cluster's database (tests start their own server
# with initdb and pg_ctl); util-linux: nsenter, to run test hosts in
# network namespaces; chromium and chromium-driver: the dashboard's
# browser tests (tests/test_dashboard.py); busybox-static: what the
# template tests' images are made of.
for p in debootstrap iproute2 nftables gcc patch python3-venv ca-certificates curl protobuf-compiler postgresql-15 util-linux chromium chromium-driver busybox-static; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  step "installing Debian packages: ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

command -v go >/dev/null || { echo "setup: Go 1.24+ is required (https://go.dev/doc/install)" >&2; exit 1; }

# Code generators, pinned (scripts/check-generated.sh compares their output).
gobin=$(go env GOPATH)/bin
[ -x "$gobin/protoc-gen-go" ] || go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.11
[ -x "$gobin/protoc-gen-connect-go" ] || go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1
OAPI_CODEGEN_VERSION=v2.8.2
if [ "$("$gobin/oapi-codegen" -version 2>/dev/null | tail -n 1)" != "$OAPI_CODEGEN_VERSION" ]; then
  go install "github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@$OAPI_CODEGEN_VERSION"
fi

# versitygw: the S3 server (S3 over a directory, Apache-2.0) the chunk
# store's tests run against. Its --version says nothing of the module's
# version, so a stamp file beside it does.
VERSITYGW_VERSION=v1.8.0
if [ "$(cat "$gobin/.versitygw.version" 2>/dev/null)" != "$VERSITYGW_VERSION" ] || [ ! -x "$gobin/versitygw" ]; then
  step "building versitygw $VERSITYGW_VERSION (the chunk store's test S3 server; a few minutes, once)"
  (cd /tmp && go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION")
  echo "$VERSITYGW_VERSION" > "$gobin/.versitygw.version"
fi

# The CNCF distribution registry: template tests push images to a local
# one (nothing reaches Docker Hub).
REGISTRY_VERSION=v3.1.2
if [ "$(cat "$LIBDIR/bin/registry.version" 2>/dev/null)" != "$REGISTRY_VERSION" ] || [ ! -x "$LIBDIR/bin/registry" ]; then
  step "building the distribution registry $REGISTRY_VERSION (for the template tests)"
  mkdir -p "$LIBDIR/bin"
  (cd /tmp && GOBIN="$LIBDIR/bin" CGO_ENABLED=0 go install "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION")
  echo "$REGISTRY_VERSION" > "$LIBDIR/bin/registry.version"
fi

# runsc is built from its module's source with cellfork's patches
# (patches/gvisor) and gVisor's seccomp filters precompiled
# (internal/runtime/gvisor/seccompgen), as the official build ships them:
# scripts/build-runsc.sh, cached per build id. The build id is runsc's
# version string; a new patch set is a new id, so it installs a new runsc,
# the daemon builds new warm images, and images of other builds are refused.
step "runsc (gVisor + patches/gvisor)"
build=$(scripts/build-runsc.sh)
RUNSC_BUILD=$(cat "$build/build-id")
if [ "$(cat "$LIBDIR/runsc.version" 2>/dev/null)" != "$RUNSC_BUILD" ] || ! cmp -s "$build/runsc" "$LIBDIR/runsc"; then
  step "installing runsc $RUNSC_BUILD into $LIBDIR"
  mkdir -p "$LIBDIR/gvisor-bin"
  install -m 0755 "$build/runsc" "$LIBDIR/runsc.new"
  mv "$LIBDIR/runsc.new" "$LIBDIR/runsc"
  echo "$RUNSC_BUILD" > "$LIBDIR/runsc.version"
fi
# Sidecars (runsc 2026-09 warns they become mandatory): the sentry is runsc
# itself; the prewarmer is ours (internal/runtime/gvisor/prewarmer).
for f in gvisor_sentry gvisor-sentry-prewarmer; do
  if ! cmp -s "$build/gvisor-bin/$f" "$LIBDIR/gvisor-bin/$f"; then
    install -m 0755 "$build/gvisor-bin/$f" "$LIBDIR/gvisor-bin/$f.new"
    mv "$LIBDIR/gvisor-bin/$f.new" "$LIBDIR/gvisor-bin/$f"
  fi
done

if [ ! -x .venv/bin/python ] || [ tests/requirements.txt -nt .venv/.installed ] || [ sdk/python/pyproject.toml -nt .venv/.installed ]; then
  step "installing Python dependencies into .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r tests/requirements.txt -e sdk/python
  touch .venv/.installed
fi
# The JS conformance suite (tests/conformance-js) runs the official `e2b`
# npm package, which wants Node.js >= 20.18.1 (Debian 12's nodejs is 18).
node_ok=$(node -e 'const [a,b,c]=process.versions.node.split(".").map(Number); console.log(a>20||(a===20&&(b>18||(b===18&&c>=1)))?"yes":"no")' 2>/dev/null || echo missing)
if [ "$node_ok" != yes ] || ! command -v npm >/dev/null; then
  echo "setup: Node.js >= 20.18.1 with npm is required for the JS conformance suite (found: $(node --version 2>/dev/null || echo no node))." >&2
  echo "setup: install it from https://nodejs.org (or NodeSource's Debian packages) and run make setup again." >&2
  exit 1
fi
js=tests/conformance-js
if [ ! -f "$js/node_modules/.installed" ] || [ "$js/package-lock.json" -nt "$js/node_modules/.installed" ]; then
  step "installing the JS conformance suite's dependencies (npm ci)"
  (cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
  touch "$js/node_modules/.installed"
fi
step "setup complete"
