#!/usr/bin/env bash
# check-generated.sh: fail if `go generate` would change committed code.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:$(go env GOPATH)/bin"
before=$(git status --porcelain -- internal/envd)
go generate ./internal/envd
after=$(git status --porcelain -- internal/envd)
if [ "$before" != "$after" ]; then
  echo "generated code in internal/envd is stale: run 'make generate' and commit"
  git --no-pager diff --stat -- internal/envd
  exit 1
fi
