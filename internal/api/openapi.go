package api

import (
	_ "embed"
	"net/http"
)

// OpenAPI is the description of every endpoint the daemon serves.
//
//go:embed openapi.yaml
var OpenAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(OpenAPI)
}

// ServeOpenAPI serves the API's OpenAPI document.
func ServeOpenAPI(w http.ResponseWriter, r *http.Request) { serveOpenAPI(w, r) }
