package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/api/apitypes"
	"github.com/cellfork/cellfork/internal/manager"
	"github.com/cellfork/cellfork/internal/runtime/fake"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/store"
)

// Network rules and maskRequestHost through the API, over a manager on
// the fake runtime: accepted in E2B's shape, reported with every header
// value redacted, kept or replaced by updates as E2B does; placeholders,
// a read-back value and more than one rule per domain are 400.
func TestNetworkRulesAPI(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fh := fake.New()
	lim := sandbox.Limits{CPUCount: 1, MemoryMB: 1024, DiskMB: 512, PidsMax: 512, OpenFiles: 65536}
	m := manager.New(manager.Config{
		DataDir: dir, DefaultLimits: lim, MaxLimits: lim, TemplateLimits: map[string]sandbox.Limits{"base": lim},
		DefaultTimeout: 5 * time.Minute, MaxTimeout: time.Hour, MaxUploadBytes: 1 << 20,
		StartConcurrency: 1, StartQueue: 4, StartWait: time.Second, MaxFork: 4, SpillAfter: time.Hour,
		EgressCA: []byte("-----BEGIN CERTIFICATE-----\n"),
	}, manager.Deps{Runtime: fh, Networks: fh.Networks(), Agent: fh.Agent(), Store: st, Templates: fakeTemplates(t, dir), Log: log})
	ctx := context.Background()
	if err := m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	srv := New(Config{APIKeys: []string{"k"}, MaxUploadBytes: 1 << 20}, m, log)
	do := func(method, path, body string) (int, map[string]any, string) {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("X-API-KEY", "k")
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		var out map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &out)
		return rec.Code, out, rec.Body.String()
	}
	const secret = "Bearer sk-live-1234567890"
	code, sb, raw := do("POST", "/v2/sandboxes", `{"templateID":"base","network":{
		"maskRequestHost":"${PORT}-app.example.com",
		"rules":{"api.example.com":[{"transform":{"headers":{"Authorization":"`+secret+`","X-Team":"t"}}}],"*.example.org":[]}}}`)
	if code != http.StatusCreated {
		t.Fatalf("create with rules: %d %s", code, raw)
	}
	id := sb["sandboxID"].(string)
	t.Cleanup(func() { _ = m.Kill(ctx, id) })
	for _, path := range []string{"/sandboxes/" + id, "/sandboxes/" + id + "/network"} {
		code, _, raw := do("GET", path, "")
		if code != 200 || strings.Contains(raw, secret) {
			t.Fatalf("GET %s: %d %s", path, code, raw)
		}
		var got struct {
			Network struct {
				Rules           map[string][]apitypes.NetworkRule `json:"rules"`
				MaskRequestHost string                            `json:"maskRequestHost"`
			} `json:"network"`
		}
		json.Unmarshal([]byte(raw), &got)
		r := got.Network.Rules["api.example.com"]
		if len(r) != 1 || r[0].Transform == nil || r[0].Transform.Headers["Authorization"] != sandbox.RedactedValue ||
			r[0].Transform.Headers["X-Team"] != sandbox.RedactedValue || len(got.Network.Rules["*.example.org"]) != 0 ||
			got.Network.MaskRequestHost != "${PORT}-app.example.com" {
			t.Errorf("GET %s reports %s", path, raw)
		}
	}
	// The record has the value; the box's network has the parsed rules.
	if rec, _ := m.Get(ctx, id); rec.Network.Rules["api.example.com"].Headers["Authorization"] != secret {
		t.Errorf("record rules: %+v", rec.Network.Rules)
	}

	// Update: rules replaced, the mask kept (ingress is the create's).
	if code, _, raw := do("PUT", "/sandboxes/"+id+"/network", `{"rules":{"api.example.com":[{"transform":{"headers":{"X-New":"v"}}}]}}`); code != 204 {
		t.Fatalf("update rules: %d %s", code, raw)
	}
	if rec, _ := m.Get(ctx, id); rec.Network.Rules["api.example.com"].Headers["X-New"] != "v" || len(rec.Network.Rules) != 1 ||
		rec.Network.MaskRequestHost != "${PORT}-app.example.com" {
		t.Errorf("after update: %+v", rec.Network)
	}
	// Domains are stored and reported in lower case, as E2B normalizes them.
	if code, _, raw := do("PUT", "/sandboxes/"+id+"/network", `{"rules":{" API.Example.com":[{"transform":{"headers":{"X-Up":"v"}}}]}}`); code != 204 {
		t.Fatalf("update with an upper-case domain: %d %s", code, raw)
	}
	if rec, _ := m.Get(ctx, id); rec.Network.Rules["api.example.com"].Headers["X-Up"] != "v" || len(rec.Network.Rules) != 1 {
		t.Errorf("upper-case domain stored as %+v", rec.Network.Rules)
	}
	if _, _, raw := do("GET", "/sandboxes/"+id, ""); !strings.Contains(raw, `"api.example.com"`) || strings.Contains(raw, "API") {
		t.Errorf("upper-case domain reported as %s", raw)
	}
	if code, _, raw := do("PUT", "/sandboxes/"+id+"/network", `{}`); code != 204 {
		t.Fatalf("update: %d %s", code, raw)
	} else if rec, _ := m.Get(ctx, id); rec.Network.Rules != nil {
		t.Errorf("{} kept the rules: %+v", rec.Network.Rules)
	}

	for what, body := range map[string]string{
		"secret placeholder": `{"rules":{"a.example":[{"transform":{"headers":{"X":"${e2b.secrets.KEY}"}}}]}}`,
		"read-back value":    `{"rules":{"a.example":[{"transform":{"headers":{"X":"` + sandbox.RedactedValue + `"}}}]}}`,
		"two rules":          `{"rules":{"a.example":[{},{}]}}`,
		"a domain twice":     `{"rules":{"a.example":[],"A.Example":[]}}`,
		"bad domain":         `{"rules":{"a b":[]}}`,
		"bad header":         `{"rules":{"a.example":[{"transform":{"headers":{"Bad Name":"v"}}}]}}`,
		"value not a string": `{"rules":{"a.example":[{"transform":{"headers":{"X":1}}}]}}`,
		"httpsPorts":         `{"httpsPorts":[443]}`,
		"null value":         `{"rules":{"a.example":[{"transform":{"headers":{"X":null}}}]}}`,
		"null rule":          `{"rules":{"a.example":[null]}}`,
		"null list":          `{"rules":{"a.example":null}}`,
	} {
		if code, out, raw := do("PUT", "/sandboxes/"+id+"/network", body); code != 400 || out["message"] == "" {
			t.Errorf("%s: %d %s", what, code, raw)
		}
	}
	for what, body := range map[string]string{
		"bad mask":       `{"templateID":"base","network":{"maskRequestHost":"a b"}}`,
		"mask with path": `{"templateID":"base","network":{"maskRequestHost":"a.example/x"}}`,
	} {
		if code, _, raw := do("POST", "/v2/sandboxes", body); code != 400 {
			t.Errorf("%s: %d %s", what, code, raw)
		}
	}
}
