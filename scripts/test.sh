#!/usr/bin/env bash
# test.sh: every test. Assumes `make setup template` ran (make test does it).
#  1. Go: vet, generated code up to date, unit tests and the integration
#     tests (test/integration starts its own daemon with real gVisor sandboxes),
#     and gVisor's own unit tests of the packages patches/gvisor changes;
#     then the cluster suite alone (test/cluster: PostgreSQL, three hosts in
#     network namespaces, two regions, gateways, faults).
#  2. Python: our SDK's tests, the official E2B SDK conformance suite, the
#     MCP server with the official MCP SDK and the dashboard in headless
#     Chromium, against a test daemon on its own port and data directory;
#     then the same daemon under the JS conformance suite (the official
#     e2b and @e2b/code-interpreter npm packages).
#  3. Fuzz: schemathesis drives every operation of internal/api/openapi.yaml
#     (control plane, envd, code interpreter) with generated valid and
#     invalid requests and checks each answer against the document, plus
#     missing and wrong keys and tokens on every operation (tests/fuzz).
#  4. Leak check: the test daemon leaves no sandbox, netns or runsc state,
#     and its log shows no recovered panic.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:$(go env GOPATH)/bin"
step() { printf '\033[1m==> %s\033[0m\n' "$*"; }

step "go vet, gofmt"
go vet ./...
unformatted=$(gofmt -l cmd internal test templates)
if [ -n "$unformatted" ]; then echo "not gofmt-ed: $unformatted"; exit 1; fi
step "generated code is up to date"
bash scripts/check-generated.sh

step "go test (unit + integration with real gVisor sandboxes)"
# One package at a time (-p 1): a daemon that starts (test/integration)
# blocks the host's networks for its sandboxes, and that includes a fake
# internet another package's test has up at that moment (internal/netns).
CELLFORK_TEMPLATE_DIR="${DATA_DIR:-/var/lib/cellfork}/templates" go test -race -count=1 -p 1 -timeout 20m $(go list ./... | grep -v /test/cluster)

step "cluster (PostgreSQL, 3 hosts in network namespaces, 2 regions, the E2B SDK through a gateway, faults)"
# Alone: it runs real sandboxes on three hosts, and shares the CPUs with
# nothing else.
CELLFORK_TEMPLATE_DIR="${DATA_DIR:-/var/lib/cellfork}/templates" go test -count=1 -timeout 20m ./test/cluster/

step "gVisor's unit tests of the patched packages (against the patched source)"
bash scripts/test-gvisor.sh

step "python tests against a test daemon"
. scripts/lib.sh
# Test artifacts (the dashboard's screenshots) outlive the test daemon's
# data; printed at the end.
export CELLFORK_ARTIFACTS=$(mktemp -d /tmp/cellfork-artifacts.XXXXXX)
start_test_daemon --max-upload-mb 64
# The test daemon's network namespaces carry a hash of its data dir.
prefix=cf$(printf '%s' "$TEST_TMP/data" | sha256sum | cut -c1-6)-
status=0
.venv/bin/pytest -q -p no:cacheprovider --ignore=tests/fuzz sdk/python/tests tests || status=$?

step "JS conformance suite (the official e2b and @e2b/code-interpreter npm packages) against the test daemon"
# The template tests look on the daemon's disk for what a failed build
# might leave (half-made layers, mounts).
(cd tests/conformance-js && CELLFORK_DATA_DIR="$TEST_TMP/data" npm test --silent) || status=$?

step "fuzz the API from its OpenAPI description (schemathesis)"
# Hypothesis keeps caches; they go with the test data, not into the tree.
HYPOTHESIS_STORAGE_DIRECTORY="$TEST_TMP/hypothesis" .venv/bin/pytest -q -p no:cacheprovider tests/fuzz || status=$?

step "leak and panic check"
# The server recovers a handler's panic and drops the connection, which a
# client may retry without noticing: the log tells.
if grep -m 3 "http: panic serving" "$TEST_TMP/daemon.log"; then echo "the test daemon panicked (above)"; status=1; fi
# Sandboxes still alive now were leaked by a test (or the fuzzing) that did
# not kill them.
alive=$(curl -fsS -H "X-API-KEY: $CELLFORK_API_KEY" "$CELLFORK_URL/v2/sandboxes" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
if [ "$alive" != 0 ]; then echo "leak: $alive sandbox(es) still alive after the Python tests"; status=1; fi
# Once the daemon has stopped (destroying its pool), nothing of it remains.
terminate_test_daemon
# (runsc's flag is -quiet; a failing list must not read as "nothing left".)
left=$(/usr/local/lib/cellfork/runsc --root "$TEST_TMP/data/runsc" list -quiet) || { echo "leak check: runsc list failed"; status=1; }
netns_left=$(ls /run/netns 2>/dev/null | grep "^$prefix" || true)
if [ "$alive" = 0 ] && [ -n "$left" ]; then echo "leak: runsc containers left: $left"; status=1; fi
if [ "$alive" = 0 ] && [ -n "$netns_left" ]; then echo "leak: network namespaces left: $netns_left"; status=1; fi
if [ "$status" != 0 ]; then echo "--- test daemon log (last 40 lines)"; tail -n 40 "$TEST_TMP/daemon.log"; fi
echo "test artifacts (dashboard screenshots): $CELLFORK_ARTIFACTS"
exit $status
