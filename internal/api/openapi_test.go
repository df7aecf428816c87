package api

import (
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/cellfork/cellfork/internal/envd/filesystem"
	"github.com/cellfork/cellfork/internal/envd/process"
	"github.com/cellfork/cellfork/internal/manager"
	"github.com/cellfork/cellfork/internal/runtime/fake"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/store"
	"github.com/cellfork/cellfork/internal/template"
)

// loadSpec loads and validates openapi.yaml (the embedded copy, which is
// what GET /openapi.yaml serves).
func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(OpenAPI)
	if err != nil {
		t.Fatalf("loading openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	return doc
}

func TestOpenAPIValid(t *testing.T) {
	doc := loadSpec(t)
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("openapi = %q, want 3.0.3", doc.OpenAPI)
	}
	if s := doc.Components.SecuritySchemes["ApiKey"]; s == nil || s.Value.In != "header" || s.Value.Name != "X-API-KEY" {
		t.Errorf("security scheme ApiKey must be the X-API-KEY header")
	}
	e := doc.Components.Schemas["Error"]
	if e == nil {
		t.Fatal("no Error schema")
	}
	if !slices.Equal(e.Value.Required, []string{"code", "message"}) {
		t.Errorf("Error.required = %v, want [code message]", e.Value.Required)
	}
	for name, typ := range map[string]string{"code": "integer", "message": "string", "requestId": "string"} {
		if p := e.Value.Properties[name]; p == nil || !p.Value.Type.Is(typ) {
			t.Errorf("Error.%s must be a %s", name, typ)
		}
	}
}

// TestOpenAPIEveryResponseHasHeaders: the daemon sets X-Request-Id and
// Server-Timing on every response, so every documented response says so.
func TestOpenAPIEveryResponseHasHeaders(t *testing.T) {
	doc := loadSpec(t)
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId", method, path)
			}
			for status, resp := range op.Responses.Map() {
				for _, h := range []string{"X-Request-Id", "Server-Timing"} {
					if resp.Value.Headers[h] == nil {
						t.Errorf("%s %s: response %s does not document %s", method, path, status, h)
					}
				}
			}
		}
	}
}

// route is a pattern registered on a ServeMux: "GET /sandboxes/{id}".
type route struct{ method, path string }

func (r route) String() string { return r.method + " " + r.path }

// muxPatterns returns the method-qualified patterns passed to
// <x>.HandleFunc / <x>.Handle with a string literal in the named function
// of a Go source file. Patterns without a method (catch-alls) are skipped.
func muxPatterns(t *testing.T, file, funcName string) []route {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, 0)
	if err != nil {
		t.Fatalf("parsing %s: %v", file, err)
	}
	var routes []route
	found := false
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != funcName {
			continue
		}
		found = true
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "HandleFunc" && sel.Sel.Name != "Handle") {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true // e.g. mux.Handle(processconnect.NewProcessHandler(...))
			}
			pattern, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatalf("%s: pattern %s: %v", file, lit.Value, err)
			}
			method, path, ok := strings.Cut(pattern, " ")
			if !ok {
				return true // a catch-all like "/"
			}
			routes = append(routes, route{method, strings.TrimSpace(path)})
			return true
		})
	}
	if !found {
		t.Fatalf("no func %s in %s", funcName, file)
	}
	if len(routes) == 0 {
		t.Fatalf("no routes found in %s.%s: did the registration style change?", file, funcName)
	}
	return routes
}

// documented reports whether doc has an operation for method and path (the
// path written as in a ServeMux pattern, which uses the same {name} syntax).
func documented(doc *openapi3.T, r route) bool {
	item := doc.Paths.Find(r.path)
	return item != nil && item.GetOperation(r.method) != nil
}

// TestOpenAPICoversControlRoutes fails when a route is added to routes()
// without being documented.
func TestOpenAPICoversControlRoutes(t *testing.T) {
	doc := loadSpec(t)
	routes := append(muxPatterns(t, "control.go", "routes"), muxPatterns(t, "ops.go", "opsRoutes")...)
	routes = append(routes, muxPatterns(t, "templates.go", "templateRoutes")...)
	for _, r := range routes {
		if r.path == "/templates/{templateID}/{sub}" {
			continue // serves /templates/{templateID}/tags: TestOpenAPITemplatePathsServed
		}
		if !documented(doc, r) {
			t.Errorf("route %s (control.go routes()) is not in openapi.yaml", r)
		}
	}
	// The routes the brief names must all still be there.
	for _, want := range []string{
		"GET /health", "GET /openapi.yaml", "POST /v2/sandboxes", "POST /sandboxes",
		"GET /v2/sandboxes", "GET /sandboxes", "GET /sandboxes/{id}", "DELETE /sandboxes/{id}",
		"POST /sandboxes/{id}/timeout", "POST /sandboxes/{id}/refreshes",
		"POST /v2/sandboxes/{id}/connect", "POST /sandboxes/{id}/connect", "GET /sandboxes/{id}/metrics",
		"POST /sandboxes/{id}/pause", "POST /sandboxes/{id}/resume", "POST /sandboxes/{id}/snapshots",
		"GET /snapshots", "GET /snapshots/usage", "GET /snapshots/{snapshotID}", "DELETE /snapshots/{snapshotID}",
		"DELETE /templates/{templateID}", "POST /sandboxes/{id}/fork", "POST /sandboxes/{id}/rollback",
		"POST /sandboxes/{id}/merge",
	} {
		if !slices.ContainsFunc(routes, func(r route) bool { return r.String() == want }) {
			t.Errorf("routes() no longer registers %s; update openapi.yaml and this list", want)
		}
	}
}

// TestOpenAPITemplatePathsServed: every documented template operation
// reaches a handler (some go through a dispatching pattern).
func TestOpenAPITemplatePathsServed(t *testing.T) {
	doc := loadSpec(t)
	srv := New(Config{}, nil, slog.New(slog.DiscardHandler))
	n := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if !slices.Contains(op.Tags, "templates") {
				continue
			}
			n++
			url := regexp.MustCompile(`\{[a-zA-Z]+\}`).ReplaceAllString(path, "x")
			req := httptest.NewRequest(method, url, nil)
			if _, pattern := srv.mux.Handler(req); pattern == "" || pattern == "/" {
				t.Errorf("%s %s is documented but not served", method, path)
			}
		}
	}
	if n < 15 {
		t.Errorf("only %d template operations documented", n)
	}
}

// TestOpenAPICoversAgentRoutes does the same for the agent's HTTP handlers,
// which the daemon serves through its data-plane proxy.
func TestOpenAPICoversAgentRoutes(t *testing.T) {
	doc := loadSpec(t)
	for _, src := range []struct{ file, fn string }{
		{"../agent/envd/envd.go", "New"},
		{"../agent/codeinterp/http.go", "Handler"},
	} {
		for _, r := range muxPatterns(t, src.file, src.fn) {
			if !documented(doc, r) {
				t.Errorf("agent route %s (%s) is not in openapi.yaml", r, filepath.Base(src.file))
			}
		}
	}
}

// TestOpenAPICoversRPCMethods checks the method enums of the Connect paths
// against the services compiled into the agent.
func TestOpenAPICoversRPCMethods(t *testing.T) {
	doc := loadSpec(t)
	for _, fd := range []protoreflect.FileDescriptor{process.File_process_process_proto, filesystem.File_filesystem_filesystem_proto} {
		svcs := fd.Services()
		for i := range svcs.Len() {
			svc := svcs.Get(i)
			path := "/" + string(svc.FullName()) + "/{method}"
			item := doc.Paths.Value(path)
			if item == nil || item.Post == nil {
				t.Errorf("openapi.yaml has no POST %s", path)
				continue
			}
			var enum []any
			for _, p := range item.Parameters {
				if p.Value.Name == "method" && p.Value.In == "path" {
					enum = p.Value.Schema.Value.Enum
				}
			}
			methods := svc.Methods()
			if len(enum) != methods.Len() {
				t.Errorf("%s: method enum %v, service has %d methods", path, enum, methods.Len())
			}
			for j := range methods.Len() {
				if name := string(methods.Get(j).Name()); !slices.Contains(enum, any(name)) {
					t.Errorf("%s: method %s is not in the enum", path, name)
				}
			}
		}
	}
}

// fakeTemplates returns a template registry whose built-in template "base"
// is already built (an empty rootfs), so creates resolve it without a build.
func fakeTemplates(t *testing.T, dir string) *template.Registry {
	t.Helper()
	agentDir := filepath.Join(dir, "agent")
	if err := os.MkdirAll(agentDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range template.AgentFiles {
		if err := os.WriteFile(filepath.Join(agentDir, f), []byte("fake"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hash, err := template.Hash("base")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "templates", "base", hash, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	return template.NewRegistry(filepath.Join(dir, "templates"), agentDir)
}

// TestOpenAPIMatchesResponses sends requests that need no sandbox to a real
// Server and checks each answer against the document: status documented,
// headers present, JSON body valid against the documented schema.
func TestOpenAPIMatchesResponses(t *testing.T) {
	doc := loadSpec(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// Two snapshots (a root and its child) that already exceed the snapshot
	// cap, so that listing, fetching, deleting, creating from a snapshot
	// and the 507 of a new snapshot can be checked without a runtime.
	t0 := time.Date(2026, 1, 1, 0, 5, 0, 123456789, time.UTC)
	for _, sn := range []*sandbox.Snapshot{
		{ID: "snapaaaaaaaaaaaaaaaa", Names: []string{"first"}, SandboxID: "i5q0w8r3m2a7k1x9c4b6", TemplateID: "base",
			Image: filepath.Join(dir, "snapshots", "snapaaaaaaaaaaaaaaaa"), SizeBytes: 2 << 20, CreatedAt: t0, CPUCount: 1, MemoryMB: 1024,
			DiskMB: 512, PidsMax: 512, OpenFiles: 65536},
		{ID: "snapbbbbbbbbbbbbbbbb", Names: []string{"team/child"}, ParentID: "snapaaaaaaaaaaaaaaaa", SandboxID: "p2n7c4x9w1q5m8k3z6b0",
			TemplateID: "base", Image: filepath.Join(dir, "snapshots", "snapbbbbbbbbbbbbbbbb"), SizeBytes: 1 << 20,
			CreatedAt: t0.Add(time.Minute), CPUCount: 1, MemoryMB: 1024},
	} {
		if err := st.PutSnapshot(context.Background(), sn); err != nil {
			t.Fatal(err)
		}
	}
	fh := fake.New()
	m := manager.New(manager.Config{
		DataDir:        dir,
		DefaultLimits:  sandbox.Limits{CPUCount: 1, MemoryMB: 1024, DiskMB: 512, PidsMax: 512, OpenFiles: 65536},
		MaxLimits:      sandbox.Limits{CPUCount: 2, MemoryMB: 2048, DiskMB: 1024, PidsMax: 1024, OpenFiles: 1 << 20},
		DefaultTimeout: 5 * time.Minute, MaxTimeout: time.Hour, MaxUploadBytes: 1 << 20,
		StartConcurrency: 1, StartQueue: 1, StartWait: time.Second,
		SnapshotCapBytes: 1 << 20, MaxFork: 4, SpillAfter: time.Second,
	}, manager.Deps{Runtime: fh, Networks: fh.Networks(), Agent: fh.Agent(), Store: st, Templates: fakeTemplates(t, dir), Log: log})
	srv := New(Config{APIKeys: []string{"k"}, MaxUploadBytes: 1 << 20}, m, log)

	type tc struct {
		name         string
		method, path string // request
		specPath     string // documented path ("" = path)
		body         string
		headers      map[string]string
		want         int
		wantHeaders  []string // response headers that must be present
	}
	key := map[string]string{"X-API-KEY": "k"}
	dp := func(port string) map[string]string {
		return map[string]string{"E2b-Sandbox-Id": "nosuchsandbox", "E2b-Sandbox-Port": port, "X-Access-Token": "t"}
	}
	cases := []tc{
		{name: "health", method: "GET", path: "/health", want: 200},
		{name: "openapi", method: "GET", path: "/openapi.yaml", want: 200},
		{name: "no key", method: "GET", path: "/v2/sandboxes", want: 401},
		{name: "bad key", method: "GET", path: "/v2/sandboxes", headers: map[string]string{"X-API-KEY": "x"}, want: 401},
		{name: "list", method: "GET", path: "/v2/sandboxes", headers: key, want: 200},
		{name: "list v1", method: "GET", path: "/sandboxes?state=running", specPath: "/sandboxes", headers: key, want: 200},
		{name: "list bad limit", method: "GET", path: "/v2/sandboxes?limit=0", specPath: "/v2/sandboxes", headers: key, want: 400},
		{name: "list bad state", method: "GET", path: "/v2/sandboxes?state=gone", specPath: "/v2/sandboxes", headers: key, want: 400},
		// A typed parameter given empty is invalid, not absent.
		{name: "list empty limit", method: "GET", path: "/v2/sandboxes?limit=", specPath: "/v2/sandboxes", headers: key, want: 400},
		{name: "list empty state", method: "GET", path: "/sandboxes?state=", specPath: "/sandboxes", headers: key, want: 400},
		{name: "list empty startedAfter", method: "GET", path: "/v2/sandboxes?startedAfter=", specPath: "/v2/sandboxes", headers: key, want: 400},
		{name: "list empty order", method: "GET", path: "/v2/sandboxes?order=", specPath: "/v2/sandboxes", headers: key, want: 400},
		{name: "list empty strings", method: "GET", path: "/v2/sandboxes?metadata=&template=&nextToken=", specPath: "/v2/sandboxes", headers: key, want: 200},
		{name: "create no template", method: "POST", path: "/v2/sandboxes", body: `{}`, headers: key, want: 400},
		{name: "create malformed", method: "POST", path: "/sandboxes", body: `{`, headers: key, want: 400},
		// autoPause is accepted: the create gets as far as the template.
		{name: "create autoPause", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"nope","autoPause":true}`, headers: key, want: 404},
		{name: "create big cpu", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","cpuCount":64}`, headers: key, want: 400},
		{name: "create from snapshot name, big cpu", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"first","cpuCount":64}`, headers: key, want: 400},
		{name: "create from snapshot id, small memory", method: "POST", path: "/sandboxes", body: `{"templateID":"snapaaaaaaaaaaaaaaaa","memoryMB":64}`, headers: key, want: 400},
		{name: "create zero cpu", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","cpuCount":0}`, headers: key, want: 400},
		{name: "create big disk", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","diskSizeMB":1025}`, headers: key, want: 400},
		{name: "create negative pids", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","pidsMax":-1}`, headers: key, want: 400},
		{name: "create few open files", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","openFiles":10}`, headers: key, want: 400},
		{name: "create from snapshot, more processes", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"first","pidsMax":1000}`, headers: key, want: 400},
		{name: "create from snapshot, other disk", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"first","diskSizeMB":256}`, headers: key, want: 400},
		{name: "create unknown template", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"nope","extra":{"a":1}}`, headers: key, want: 404},
		{name: "get unknown", method: "GET", path: "/sandboxes/abc", specPath: "/sandboxes/{id}", headers: key, want: 404},
		{name: "kill unknown", method: "DELETE", path: "/sandboxes/abc", specPath: "/sandboxes/{id}", headers: key, want: 404},
		{name: "timeout missing", method: "POST", path: "/sandboxes/abc/timeout", specPath: "/sandboxes/{id}/timeout", body: `{}`, headers: key, want: 400},
		{name: "timeout unknown", method: "POST", path: "/sandboxes/abc/timeout", specPath: "/sandboxes/{id}/timeout", body: `{"timeout":30}`, headers: key, want: 404},
		{name: "refresh unknown", method: "POST", path: "/sandboxes/abc/refreshes", specPath: "/sandboxes/{id}/refreshes", headers: key, want: 404},
		{name: "connect unknown", method: "POST", path: "/v2/sandboxes/abc/connect", specPath: "/v2/sandboxes/{id}/connect", body: `{}`, headers: key, want: 404},
		{name: "connect v1 unknown", method: "POST", path: "/sandboxes/abc/connect", specPath: "/sandboxes/{id}/connect", headers: key, want: 404},
		{name: "metrics bad start", method: "GET", path: "/sandboxes/abc/metrics?start=x", specPath: "/sandboxes/{id}/metrics", headers: key, want: 400},
		{name: "metrics empty end", method: "GET", path: "/sandboxes/abc/metrics?end=", specPath: "/sandboxes/{id}/metrics", headers: key, want: 400},
		{name: "metrics unknown", method: "GET", path: "/sandboxes/abc/metrics", specPath: "/sandboxes/{id}/metrics", headers: key, want: 404},
		{name: "connect bad timeout", method: "POST", path: "/v2/sandboxes/abc/connect", specPath: "/v2/sandboxes/{id}/connect", body: `{"timeout":99999}`, headers: key, want: 400},
		{name: "pause unknown", method: "POST", path: "/sandboxes/abc/pause", specPath: "/sandboxes/{id}/pause", body: `{"memory":true}`, headers: key, want: 404},
		{name: "pause malformed", method: "POST", path: "/sandboxes/abc/pause", specPath: "/sandboxes/{id}/pause", body: `{`, headers: key, want: 400},
		{name: "resume unknown", method: "POST", path: "/sandboxes/abc/resume", specPath: "/sandboxes/{id}/resume", headers: key, want: 404},
		{name: "resume bad timeout", method: "POST", path: "/sandboxes/abc/resume", specPath: "/sandboxes/{id}/resume", body: `{"timeout":-1}`, headers: key, want: 400},
		// An unknown sandbox is reported before the name and the cap are
		// looked at (the E2B SDK maps 404 to SandboxNotFoundException);
		// test/integration covers 400 (bad or reserved name) and 409.
		{name: "snapshot of unknown sandbox with a bad name", method: "POST", path: "/sandboxes/abc/snapshots", specPath: "/sandboxes/{id}/snapshots", body: `{"name":"-x"}`, headers: key, want: 404},
		{name: "snapshot of unknown sandbox with a taken name", method: "POST", path: "/sandboxes/abc/snapshots", specPath: "/sandboxes/{id}/snapshots", body: `{"name":"first"}`, headers: key, want: 404},
		{name: "snapshot of unknown sandbox named tree", method: "POST", path: "/sandboxes/abc/snapshots", specPath: "/sandboxes/{id}/snapshots", body: `{"name":"tree"}`, headers: key, want: 404},
		{name: "snapshot of unknown sandbox over the cap", method: "POST", path: "/sandboxes/abc/snapshots", specPath: "/sandboxes/{id}/snapshots", body: `{"name":"new"}`, headers: key, want: 404},
		{name: "list snapshots", method: "GET", path: "/snapshots", headers: key, want: 200},
		{name: "list snapshots paged", method: "GET", path: "/snapshots?limit=1", specPath: "/snapshots", headers: key, want: 200, wantHeaders: []string{"X-Next-Token"}},
		{name: "list snapshots of a sandbox", method: "GET", path: "/snapshots?sandboxID=p2n7c4x9w1q5m8k3z6b0&name=team%2Fchild", specPath: "/snapshots", headers: key, want: 200},
		{name: "list snapshots bad limit", method: "GET", path: "/snapshots?limit=1001", specPath: "/snapshots", headers: key, want: 400},
		{name: "list snapshots empty limit", method: "GET", path: "/snapshots?limit=", specPath: "/snapshots", headers: key, want: 400},
		{name: "list snapshots bad token", method: "GET", path: "/snapshots?nextToken=x", specPath: "/snapshots", headers: key, want: 400},
		{name: "snapshot usage", method: "GET", path: "/snapshots/usage", headers: key, want: 200},
		{name: "snapshot tree", method: "GET", path: "/snapshots/tree", headers: key, want: 200},
		{name: "get snapshot by name", method: "GET", path: "/snapshots/first", specPath: "/snapshots/{snapshotID}", headers: key, want: 200},
		{name: "get snapshot unknown", method: "GET", path: "/snapshots/nope", specPath: "/snapshots/{snapshotID}", headers: key, want: 404},
		{name: "delete snapshot unknown", method: "DELETE", path: "/snapshots/nope", specPath: "/snapshots/{snapshotID}", headers: key, want: 404},
		{name: "delete template unknown", method: "DELETE", path: "/templates/base", specPath: "/templates/{templateID}", headers: key, want: 404},
		{name: "fork count 0", method: "POST", path: "/sandboxes/abc/fork", specPath: "/sandboxes/{id}/fork", body: `{"count":0}`, headers: key, want: 400},
		{name: "fork count over max", method: "POST", path: "/sandboxes/abc/fork", specPath: "/sandboxes/{id}/fork", body: `{"count":5}`, headers: key, want: 400},
		{name: "fork unknown", method: "POST", path: "/sandboxes/abc/fork", specPath: "/sandboxes/{id}/fork", body: `{"count":2,"timeout":60}`, headers: key, want: 404},
		{name: "rollback no snapshot", method: "POST", path: "/sandboxes/abc/rollback", specPath: "/sandboxes/{id}/rollback", body: `{}`, headers: key, want: 400},
		{name: "rollback unknown snapshot", method: "POST", path: "/sandboxes/abc/rollback", specPath: "/sandboxes/{id}/rollback", body: `{"snapshotID":"nope"}`, headers: key, want: 404},
		{name: "rollback unknown sandbox", method: "POST", path: "/sandboxes/abc/rollback", specPath: "/sandboxes/{id}/rollback", body: `{"snapshotID":"first"}`, headers: key, want: 404},
		{name: "merge no child", method: "POST", path: "/sandboxes/abc/merge", specPath: "/sandboxes/{id}/merge", body: `{}`, headers: key, want: 400},
		{name: "merge into itself", method: "POST", path: "/sandboxes/abc/merge", specPath: "/sandboxes/{id}/merge", body: `{"sandboxID":"abc"}`, headers: key, want: 400},
		// A lost body must not reset the egress policy to allow-all; the
		// body is checked before the sandbox is looked up.
		{name: "network without a body", method: "PUT", path: "/sandboxes/abc/network", specPath: "/sandboxes/{id}/network", headers: key, want: 400},
		{name: "network null body", method: "PUT", path: "/sandboxes/abc/network", specPath: "/sandboxes/{id}/network", body: ` null `, headers: key, want: 400},
		{name: "pause null body", method: "POST", path: "/sandboxes/abc/pause", specPath: "/sandboxes/{id}/pause", body: `null`, headers: key, want: 400},
		{name: "network unknown", method: "PUT", path: "/sandboxes/abc/network", specPath: "/sandboxes/{id}/network", body: `{}`, headers: key, want: 404},
		{name: "merge unknown", method: "POST", path: "/sandboxes/abc/merge", specPath: "/sandboxes/{id}/merge", body: `{"sandboxID":"def"}`, headers: key, want: 404},
		// Last: deletes a snapshot, by a name with a percent-encoded slash
		// (as the E2B SDK sends it).
		{name: "delete snapshot as template", method: "DELETE", path: "/templates/team%2Fchild", specPath: "/templates/{templateID}", headers: key, want: 204},
		{name: "data plane health, no sandbox", method: "GET", path: "/health", headers: dp("49983"), want: 502},
		{name: "data plane bad port", method: "GET", path: "/health", headers: map[string]string{"E2b-Sandbox-Id": "abc"}, want: 400},
		{name: "files, no sandbox", method: "GET", path: "/files?path=/a", specPath: "/files", headers: dp("49983"), want: 502},
		{name: "execute, no sandbox", method: "POST", path: "/execute", body: `{"code":"1"}`, headers: dp("49999"), want: 502},
		{name: "rpc, no sandbox", method: "POST", path: "/process.Process/Start", specPath: "/process.Process/{method}", body: `{}`, headers: dp("49983"), want: 502},
		{name: "host form, no sandbox", method: "GET", path: "/contexts", headers: map[string]string{"Host": "49999-abc.example.com"}, want: 502},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
			for k, v := range c.headers {
				if k == "Host" {
					req.Host = v
				} else {
					req.Header.Set(k, v)
				}
			}
			rec := httptest.NewRecorder()
			srv.ServeHTTP(rec, req)
			res := rec.Result()
			if res.StatusCode != c.want {
				t.Fatalf("status %d, want %d; body %s", res.StatusCode, c.want, rec.Body)
			}
			for _, h := range c.wantHeaders {
				if res.Header.Get(h) == "" {
					t.Errorf("header %s missing", h)
				}
			}
			specPath := c.specPath
			if specPath == "" {
				specPath = c.path
			}
			checkAgainstDoc(t, doc, c.method, specPath, res, rec.Body.Bytes())
		})
	}
}

// checkAgainstDoc checks one answer against the document: status
// documented, headers present and valid, JSON body valid against the
// documented schema, error bodies carrying the request id.
func checkAgainstDoc(t *testing.T, doc *openapi3.T, method, specPath string, res *http.Response, raw []byte) {
	t.Helper()
	item := doc.Paths.Value(specPath)
	if item == nil || item.GetOperation(method) == nil {
		t.Fatalf("%s %s is not documented", method, specPath)
	}
	resp := item.GetOperation(method).Responses.Status(res.StatusCode)
	if resp == nil {
		t.Fatalf("%s %s: status %d is not documented", method, specPath, res.StatusCode)
	}
	for h := range resp.Value.Headers {
		if v := resp.Value.Headers[h].Value; v.Required && res.Header.Get(h) == "" {
			t.Errorf("header %s missing", h)
		}
		if sch := resp.Value.Headers[h].Value.Schema; res.Header.Get(h) != "" && sch != nil {
			if err := sch.Value.VisitJSON(res.Header.Get(h)); err != nil {
				t.Errorf("header %s = %q: %v", h, res.Header.Get(h), err)
			}
		}
	}
	if st := res.Header.Get("Server-Timing"); !serverTimingRE.MatchString(st) {
		t.Errorf("Server-Timing %q is not a list of name;dur=ms ending with total", st)
	}
	if res.StatusCode == http.StatusNoContent || len(resp.Value.Content) == 0 && len(raw) == 0 {
		if len(raw) != 0 || len(resp.Value.Content) != 0 {
			t.Errorf("%d with a body (%d bytes) or documented content", res.StatusCode, len(raw))
		}
		return
	}
	ct, _, _ := strings.Cut(res.Header.Get("Content-Type"), ";")
	mt := resp.Value.Content.Get(ct)
	if mt == nil {
		t.Fatalf("content type %q of status %d is not documented", ct, res.StatusCode)
	}
	if ct != "application/json" {
		return
	}
	var body any
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("body is not JSON: %v: %s", err, raw)
	}
	if err := mt.Schema.Value.VisitJSON(body); err != nil {
		t.Errorf("body %s does not match the documented schema: %v", bytes.TrimSpace(raw), err)
	}
	if res.StatusCode >= 400 {
		if id, _ := body.(map[string]any)["requestId"].(string); id != res.Header.Get("X-Request-Id") {
			t.Errorf("requestId %q != X-Request-Id %q", id, res.Header.Get("X-Request-Id"))
		}
	}
}

var serverTimingRE = regexp.MustCompile(`^([a-z]+;dur=[0-9]+\.[0-9]{2}, )*total;dur=[0-9]+\.[0-9]{2}$`)

// TestOpenAPIServed: GET /openapi.yaml serves this very file.
func TestOpenAPIServed(t *testing.T) {
	want, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(Config{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
	if rec.Code != 200 || !bytes.Equal(rec.Body.Bytes(), want) {
		t.Fatalf("GET /openapi.yaml: %d, %d bytes; want 200 and openapi.yaml (%d bytes)", rec.Code, rec.Body.Len(), len(want))
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/yaml" {
		t.Errorf("Content-Type %q", ct)
	}
}
