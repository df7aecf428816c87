package api

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/cellfork/cellfork/internal/api/apitypes"
)

// TestMethodNotAllowed: a path the API serves, asked with a method it does
// not serve, is 405 with Allow; an unknown path stays 404.
func TestMethodNotAllowed(t *testing.T) {
	srv := New(Config{APIKeys: []string{"k"}}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, c := range []struct {
		method, path string
		want         int
		allow        string
	}{
		{"TRACE", "/openapi.yaml", 405, "GET, HEAD"},
		{"PATCH", "/v2/sandboxes", 405, "GET, HEAD, POST"},
		{"PUT", "/sandboxes/abc", 405, "GET, HEAD, DELETE"},
		{"DELETE", "/sandboxes/abc/network", 405, "GET, HEAD, PUT"},
		{"GET", "/sandboxes/abc/fork", 405, "POST"},
		{"GET", "/no/such/path", 404, ""},
	} {
		req := httptest.NewRequest(c.method, c.path, nil)
		req.Header.Set("X-API-KEY", "k")
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		if rec.Code != c.want || rec.Header().Get("Allow") != c.allow {
			t.Errorf("%s %s: %d Allow %q, want %d Allow %q", c.method, c.path, rec.Code, rec.Header().Get("Allow"), c.want, c.allow)
		}
		var body apitypes.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Code != c.want || body.Message == "" {
			t.Errorf("%s %s: body %s is not the error body", c.method, c.path, rec.Body)
		}
	}
	// The key is checked first, as for every control-plane path.
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(http.MethodPatch, "/v2/sandboxes", nil))
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("PATCH without a key: %d, want 401", rec.Code)
	}
}
