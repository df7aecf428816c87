// Package apitypes holds the Go types of the control plane's JSON bodies,
// generated from ../openapi.yaml (the one description of the HTTP API) and
// committed. The daemon's handlers (internal/api) and the CLI
// (internal/cli) both use them, so a wire shape is declared once.
// `go generate ./internal/api/apitypes` regenerates them with the
// oapi-codegen that scripts/setup.sh installs (configured by
// oapi-codegen.yaml; overlay.yaml holds the few Go-only rendering hints);
// CI fails if that changes anything (scripts/check-generated.sh).
// values.go converts between the generated pointers and zero-means-absent
// values.
package apitypes

//go:generate oapi-codegen -config oapi-codegen.yaml ../openapi.yaml
