# cellfork — see README.md. Everything here runs as root on Debian 12.
SHELL := /bin/bash
DATA_DIR ?= /var/lib/cellfork
ADDR ?= 127.0.0.1:3000
GO_BUILD := CGO_ENABLED=0 go build -trimpath

.PHONY: all setup build template demo stop test bench security-report generate clean cluster-demo

all: build

setup:
	@bash scripts/setup.sh

build:
	@mkdir -p bin
	$(GO_BUILD) -o bin/cellfork ./cmd/cellfork
	$(GO_BUILD) -o bin/cellfork-agent ./cmd/cellfork-agent
	@cp internal/agent/codeinterp/kernel.py internal/agent/codeinterp/kernel_rich.py internal/agent/codeinterp/kernel.js internal/agent/codeinterp/kernel.R \
		internal/agent/codeinterp/kernel.java internal/agent/codeinterp/kernel.sh bin/

template: build
	@bin/cellfork template build --data-dir $(DATA_DIR)

# demo: install what is missing, build, start the daemon in the background,
# run examples/quickstart.py against it and leave it running.
demo: setup template
	@bash scripts/demo.sh "$(DATA_DIR)" "$(ADDR)"

stop:
	@bash scripts/stop.sh "$(DATA_DIR)"

# test: install what is missing and run every test (Go unit + integration
# with real gVisor sandboxes, Python SDK tests, E2B SDK conformance).
test: setup template
	@bash scripts/test.sh

bench: setup template
	@bash scripts/bench.sh

# security-report: run the integration suite (real gVisor sandboxes) and
# write docs/security.md from the attacks it ran.
security-report: setup template
	CELLFORK_SECURITY_REPORT=$(CURDIR)/docs/security.md CELLFORK_TEMPLATE_DIR=$(DATA_DIR)/templates \
		go test -count=1 -timeout 20m ./test/integration/

generate:
	PATH="$$PATH:$$(go env GOPATH)/bin" go generate ./...
	python3 sdk/python/scripts/unasync.py

clean:
	rm -rf bin
cluster-demo: build
	@go run ./test/cluster/demo
