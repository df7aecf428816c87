#!/usr/bin/env bash
# check-generated.sh: fail if regenerating would change committed code:
# the envd wire code (protoc, from internal/envd/proto), the control
# plane's Go types (oapi-codegen, from internal/api/openapi.yaml) and the
# Python SDK's sync modules (sdk/python/scripts/unasync.py: sandbox.py and
# template.py, from their async twins). scripts/setup.sh installs the generators, pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:$(go env GOPATH)/bin"
generated=(internal/envd internal/api/apitypes sdk/python/src/cellfork/sandbox.py sdk/python/src/cellfork/template.py)
# Content, not git status: a file already edited (or not yet committed)
# must still match what its generator makes of it.
sums() { find "${generated[@]}" -type f -print0 | sort -z | xargs -0 sha256sum; }
before=$(sums)
go generate ./internal/envd ./internal/api/apitypes
python3 sdk/python/scripts/unasync.py
after=$(sums)
if [ "$before" != "$after" ]; then
  echo "generated code is stale: run 'make generate' and commit"
  git --no-pager diff --stat -- "${generated[@]}"
  exit 1
fi
