// Package apitypes holds the Go types of the control plane's JSON bodies,
// generated from ../openapi.yaml (the one description of the HTTP API) and
// committed. The daemon's handlers (internal/api) and the CLI
// (internal/cli) both use them, so a wire shape is declared once.
// `go generate ./internal/api/apitypes` regenerates them with the
// oapi-codegen that scripts/setup.sh installs; CI fails if that changes
// anything (scripts/check-generated.sh).
package apitypes

//go:generate oapi-codegen -config oapi-codegen.yaml ../openapi.yaml
