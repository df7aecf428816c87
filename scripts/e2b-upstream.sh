#!/usr/bin/env bash
# e2b-upstream.sh: run E2B's own SDK test suites against this build, as a
# new user would run them, and summarize (docs/e2b-compatibility.md). Not
# part of `make test`: it needs a checkout of e2b-dev/E2B, installs the
# suites' dev dependencies from PyPI and npm into a temporary directory
# (never into this repository), and takes about half an hour.
#
#   scripts/e2b-upstream.sh [-s python|js|all] <E2B checkout or git dir>
#
# Environment: PORT (3350; the TLS front takes PORT+1), TEMPLATE_DIR
# (/var/lib/cellfork/templates), OUT (results; a new /tmp directory),
# PYTHON_SDK (what pip installs as the SDK; default the checkout's
# packages/python-sdk, e.g. e2b==2.63.0), PYTHON_TESTS (pytest arguments
# instead of the default selection), JS_TESTS (vitest filters instead of
# tests/sandbox tests/api tests/envd; "none" runs only tests/template),
# DOCKER_HUB_STANDIN (set: the daemon pulls Docker Hub images from a local
# registry holding busybox as ubuntu:22.04, for the template tests that
# pull ubuntu:22.04; they are counted apart either way).
#
# The E2B source is a work tree of https://github.com/e2b-dev/E2B or a bare
# git directory (its HEAD is exported). Run as root after `make build`.
#
# What it does:
#  1. Starts a fresh daemon (own data directory, port $PORT) with
#     `--domain cellfork.test:$TLS_PORT`, and a TLS front on $TLS_PORT with
#     a throwaway wildcard certificate: the deployment docs/setup.md
#     describes, so get_host() URLs work. The wildcard DNS record is stood
#     in for by a resolver hook in the test processes (*.cellfork.test ->
#     127.0.0.1), which also trust the certificate.
#  2. python: the SDK from the checkout (packages/python-sdk) in a venv with
#     its test dependencies; runs tests/{sync,async}/{sandbox,api}_*,
#     tests/shared/git and the template tests (tests/{sync,async}/template_*,
#     tests/shared/template) serially (no xdist), with E2B_API_URL and
#     E2B_SANDBOX_URL set to the daemon.
#  3. js: the SDK source from the checkout (packages/js-sdk, imported by
#     its tests as ../src) with its runtime dependencies and vitest, msw,
#     dotenv; runs tests/sandbox, tests/api and tests/envd, then
#     tests/template (the SDK's template project settings), one file at a
#     time.
#  4. Tests that mock the API (they assert what the SDK does with no
#     E2B_API_URL/E2B_SANDBOX_URL) are run again without those variables;
#     that result counts. Tests listed in scripts/e2b-upstream/exclusions.txt
#     (they need E2B's cloud or the public internet) run but are counted
#     apart. The summary goes to $OUT/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
harness=$repo/scripts/e2b-upstream

suites=all
if [ "${1:-}" = -s ]; then suites=$2; shift 2; fi
src=${1:?usage: scripts/e2b-upstream.sh [-s python|js|all] <E2B checkout or git dir>}
PORT=${PORT:-3350}
TLS_PORT=${TLS_PORT:-$((PORT + 1))}
TEMPLATE_DIR=${TEMPLATE_DIR:-/var/lib/cellfork/templates}
OUT=${OUT:-$(mktemp -d /tmp/e2b-upstream.XXXXXX)}
DOMAIN=cellfork.test
step() { printf '\033[1m==> %s\033[0m\n' "$*"; }

[ -x bin/cellfork ] || { echo "bin/cellfork missing: run make build" >&2; exit 1; }
mkdir -p "$OUT"
work=$OUT/work
rm -rf "$work" && mkdir -p "$work"

step "exporting the E2B sources into $work"
if git -C "$src" rev-parse --is-bare-repository 2>/dev/null | grep -q true; then
  git --git-dir "$src" archive HEAD packages/python-sdk packages/js-sdk | tar -x -C "$work"
  git --git-dir "$src" log -1 --format='E2B %h %cd' > "$OUT/source.txt"
else
  mkdir -p "$work/packages"
  for p in python-sdk js-sdk; do
    tar -C "$src/packages" --exclude node_modules --exclude .venv -cf - "$p" | tar -x -C "$work/packages"
  done
  git -C "$src" log -1 --format='E2B %h %cd' > "$OUT/source.txt" 2>/dev/null || echo "E2B (not a git checkout)" > "$OUT/source.txt"
fi
cat "$OUT/source.txt"

step "a fresh daemon on 127.0.0.1:$PORT, --domain $DOMAIN:$TLS_PORT, TLS front on $TLS_PORT"
key="e2b_$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')" # the format SDK 2.45 insists on
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$DOMAIN" \
  -addext "subjectAltName=DNS:$DOMAIN,DNS:*.$DOMAIN" -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
serve_flags=()
if [ -n "${DOCKER_HUB_STANDIN:-}" ]; then
  # Docker Hub stood in for: a local registry (tests/conformance/_registry.py)
  # with a busybox image as library/ubuntu:22.04, as --registry-mirror.
  step "Docker Hub stood in for: busybox as ubuntu:22.04 in a local registry"
  coproc standin { exec .venv/bin/python tests/conformance/_registry.py --push library/ubuntu:22.04; }
  read -r standin_host <&"${standin[0]}"
  standin_host=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["host"])' "$standin_host")
  serve_flags+=(--registry-mirror "docker.io=$standin_host")
fi
CELLFORK_API_KEY=$key bin/cellfork serve --addr "127.0.0.1:$PORT" --data-dir "$work/data" \
  --template-dir "$TEMPLATE_DIR" --domain "$DOMAIN:$TLS_PORT" "${serve_flags[@]}" > "$OUT/daemon.log" 2>&1 &
daemon=$!
python3 "$harness/tls_front.py" --listen "127.0.0.1:$TLS_PORT" --to "127.0.0.1:$PORT" \
  --cert "$work/cert.pem" --key "$work/key.pem" > "$OUT/tls-front.log" 2>&1 &
front=$!
cleanup() {
  if kill -0 "$daemon" 2>/dev/null; then
    for id in $(curl -fsS -H "X-API-KEY: $key" "http://127.0.0.1:$PORT/v2/sandboxes?state=running,paused" 2>/dev/null |
      python3 -c 'import json,sys; print(" ".join(s["sandboxID"] for s in json.load(sys.stdin)))' 2>/dev/null); do
      curl -fsS -X DELETE -H "X-API-KEY: $key" "http://127.0.0.1:$PORT/sandboxes/$id" >/dev/null 2>&1 || true
    done
    kill -TERM "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  kill -TERM "$front" 2>/dev/null || true
  # End of its stdin stops the stand-in registry and removes its files.
  if [ -n "${standin_PID:-}" ]; then eval "exec ${standin[1]}>&-"; wait "$standin_PID" 2>/dev/null || true; fi
  for _ in 1 2 3; do umount "$work/data/runsc/null-netns" 2>/dev/null || true; done
  rm -rf "$work/data"
}
trap cleanup EXIT
for _ in $(seq 1 600); do curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break; sleep 1; done
curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null || { tail -n 20 "$OUT/daemon.log"; exit 1; }

export E2B_API_URL=http://127.0.0.1:$PORT E2B_SANDBOX_URL=http://127.0.0.1:$PORT E2B_API_KEY=$key
export CELLFORK_WILDCARD_DOMAIN=$DOMAIN CELLFORK_WILDCARD_CA=$work/cert.pem NODE_EXTRA_CA_CERTS=$work/cert.pem
: > "$OUT/summary.txt"

if [ "$suites" = all ] || [ "$suites" = python ]; then
  step "python-sdk: SDK ${PYTHON_SDK:-from the checkout}, test dependencies from PyPI"
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install -q --upgrade pip
  "$work/venv/bin/pip" install -q "${PYTHON_SDK:-$work/packages/python-sdk}" pytest==9.2.0 pytest-xdist==3.8.0 \
    pytest-asyncio==1.5.0 pytest-timeout==2.4.0 python-dotenv==1.1.1 pytest-dotenv==0.5.2
  # The template suites mix builds against the daemon with tests that
  # mock the API or need no server; everything else in python-sdk/tests
  # is offline unit tests of the SDK, or volumes and secrets (mocked).
  selection=(tests/sync/sandbox_sync tests/async/sandbox_async tests/sync/api_sync tests/async/api_async tests/shared/git
    tests/sync/template_sync tests/async/template_async tests/shared/template)
  if [ -n "${PYTHON_TESTS:-}" ]; then read -ra selection <<< "$PYTHON_TESTS"; fi
  step "python-sdk: ${selection[*]} (serially)"
  (cd "$work/packages/python-sdk" && PYTHONPATH="$harness" "$work/venv/bin/pytest" -p wildcard_dns -p no:cacheprovider -q -n 0 \
    --junitxml "$OUT/python.xml" "${selection[@]}" > "$OUT/python.log" 2>&1) || true
  tail -n 3 "$OUT/python.log"
  # Mocked tests: they assert the SDK's defaults, which E2B_SANDBOX_URL
  # changes; run again without the variables.
  mocked=(tests/sync/sandbox_sync/test_config_propagation.py::test_connect_sets_stable_host_routing_headers
    tests/async/sandbox_async/test_config_propagation.py::test_connect_sets_stable_host_routing_headers)
  if [ -z "${PYTHON_TESTS:-}" ]; then
    (cd "$work/packages/python-sdk" && env -u E2B_API_URL -u E2B_SANDBOX_URL -u E2B_API_KEY \
      "$work/venv/bin/pytest" -p no:cacheprovider -q -n 0 --junitxml "$OUT/python-mocked.xml" "${mocked[@]}" \
      > "$OUT/python-mocked.log" 2>&1) || true
  fi
  python3 "$harness/summarize.py" python "$harness/exclusions.txt" "$OUT/python.xml" "$OUT/python-mocked.xml" | tee -a "$OUT/summary.txt"
fi

if [ "$suites" = all ] || [ "$suites" = js ]; then
  step "js-sdk: its runtime dependencies, vitest, msw and dotenv from npm"
  js=$work/packages/js-sdk
  # The SDK's own package.json also pulls playwright, wrangler and a
  # browser toolchain; install what the Node tests import, at the
  # versions it declares.
  node -e '
    const p = require(process.argv[1]);
    const dev = p.devDependencies;
    const deps = { ...p.dependencies };
    for (const n of ["vitest", "msw", "dotenv", "error-stack-parser-es", "@types/node"]) deps[n] = dev[n];
    require("fs").writeFileSync(process.argv[2], JSON.stringify({ name: "e2b-upstream-run", private: true, dependencies: deps }, null, 2));
  ' "$js/package.json" "$work/js-deps.json"
  mkdir -p "$work/js-deps" && cp "$work/js-deps.json" "$work/js-deps/package.json"
  (cd "$work/js-deps" && npm install --no-audit --no-fund --loglevel=error > "$OUT/npm.log" 2>&1)
  ln -sfn "$work/js-deps/node_modules" "$js/node_modules"
  cp "$harness/vitest.config.mts" "$js/vitest.upstream.config.mts"
  mocked_js=(tests/api/validateApiKey.test.ts tests/sandbox/egressProxy.test.ts tests/sandbox/iam.test.ts
    tests/sandbox/lifecycleRequest.test.ts tests/sandbox/networkTransform.test.ts tests/sandbox/urls.test.ts)
  read -ra js_tests <<< "${JS_TESTS:-tests/sandbox tests/api tests/envd}"
  if [ "${js_tests[*]}" != none ]; then
    step "js-sdk: ${js_tests[*]} (one file at a time)"
    (cd "$js" && NODE_OPTIONS="--require $harness/wildcard-dns.cjs" node_modules/.bin/vitest run \
      --config vitest.upstream.config.mts --reporter=junit --outputFile "$OUT/js.xml" \
      "${js_tests[@]}" > "$OUT/js.log" 2>&1) || true
  fi
  # The template tests: the SDK's `template` project (180 s a test).
  cp "$harness/vitest.template.config.mts" "$js/vitest.template.config.mts"
  step "js-sdk: tests/template (one file at a time)"
  (cd "$js" && NODE_OPTIONS="--require $harness/wildcard-dns.cjs" node_modules/.bin/vitest run \
    --config vitest.template.config.mts --reporter=junit --outputFile "$OUT/js-template.xml" \
    tests/template > "$OUT/js-template.log" 2>&1) || true
  # Mocked tests (msw answers for https://api.e2b.app, the SDK's default)
  # run again without the URLs; tags.test.ts only its mocked half. The
  # template ones want an API key (any; msw answers), as in E2B's CI.
  if [ "${js_tests[*]}" != none ]; then
    (cd "$js" && env -u E2B_API_URL -u E2B_SANDBOX_URL -u E2B_API_KEY node_modules/.bin/vitest run \
      --config vitest.upstream.config.mts --reporter=junit --outputFile "$OUT/js-mocked.xml" \
      "${mocked_js[@]}" > "$OUT/js-mocked.log" 2>&1) || true
  fi
  (cd "$js" && env -u E2B_API_URL -u E2B_SANDBOX_URL node_modules/.bin/vitest run \
    --config vitest.template.config.mts --reporter=junit --outputFile "$OUT/js-template-mocked.xml" \
    tests/template/boundOpts.test.ts tests/template/stacktrace.test.ts > "$OUT/js-template-mocked.log" 2>&1) || true
  (cd "$js" && env -u E2B_API_URL -u E2B_SANDBOX_URL node_modules/.bin/vitest run \
    --config vitest.template.config.mts --reporter=junit --outputFile "$OUT/js-template-mocked-tags.xml" \
    tests/template/tags.test.ts -t 'Template tags unit tests' > "$OUT/js-template-mocked-tags.log" 2>&1) || true
  python3 "$harness/summarize.py" js "$harness/exclusions.txt" "$OUT/js.xml" "$OUT/js-template.xml" \
    "$OUT/js-mocked.xml" "$OUT/js-template-mocked.xml" "$OUT/js-template-mocked-tags.xml" | tee -a "$OUT/summary.txt"
fi
echo "results: $OUT (summary.txt, *.xml, *.log)"
