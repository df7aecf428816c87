package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/templates"
	"github.com/cellfork/cellfork/internal/templates/build"
	"github.com/cellfork/cellfork/internal/templates/layers"
)

// stubBuilder makes a build's result directories; a RUN of "fail" fails.
type stubBuilder struct{}

func (stubBuilder) Build(_ context.Context, job build.Job) (*build.Result, error) {
	job.Log(build.Entry{Level: "info", Step: "base", Message: "FROM x"})
	for _, st := range job.Spec.Steps {
		if len(st.Args) > 0 && st.Args[0] == "fail" {
			job.Log(build.Entry{Level: "error", Step: "1", Message: "boom"})
			return nil, &build.StepError{Step: "1", Err: errors.New("failed to run command 'fail': exit status 1")}
		}
	}
	img := filepath.Join(job.Dir, "warm-k")
	os.MkdirAll(img, 0o700)
	os.WriteFile(filepath.Join(img, "checkpoint.img"), nil, 0o600)
	return &build.Result{Rootfs: filepath.Join(job.Dir, "rootfs"), Image: img, WarmKey: "k"}, nil
}
func (stubBuilder) WarmKey(build.Spec, build.Context, sandbox.Limits) (string, error) {
	return "k", nil
}
func (stubBuilder) Warm(context.Context, string, build.Spec, build.Context, sandbox.Limits, string, func(build.Entry)) error {
	return nil
}
func (stubBuilder) InstallAgent(string) error       { return nil }
func (stubBuilder) AgentLayerName() (string, error) { return "agent-x", nil }

type stubPool struct{}

func (stubPool) WarmCustom(templates.Resolved, int)                   {}
func (stubPool) UnwarmCustom(string)                                  {}
func (stubPool) RootfsInUse(context.Context) (map[string]bool, error) { return nil, nil }

// TestOpenAPITemplateResponses walks E2B's template flow (create, upload
// link, upload, start, status, logs, list, tags, alias, delete) and its
// errors against a real service with a stub builder, checking every answer
// against the document.
func TestOpenAPITemplateResponses(t *testing.T) {
	doc := loadSpec(t)
	dir := t.TempDir()
	ls, err := layers.Open(filepath.Join(dir, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := templates.Open(templates.Config{Dir: dir, Builder: stubBuilder{}, Layers: ls, Pool: stubPool{},
		Defaults:  sandbox.Limits{CPUCount: 1, MemoryMB: 1024, DiskMB: 512, PidsMax: 512, OpenFiles: 1024},
		MaxLimits: sandbox.Limits{CPUCount: 2, MemoryMB: 2048, DiskMB: 1024, PidsMax: 1024, OpenFiles: 1 << 20},
		Reserved:  []string{"base"}, MaxUploadBytes: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	svc.Start()
	defer svc.Close()
	srv := New(Config{APIKeys: []string{"k"}, Templates: svc,
		BuiltinLimits: map[string]sandbox.Limits{"base": {CPUCount: 1, MemoryMB: 1024, DiskMB: 512}}}, nil, slog.New(slog.DiscardHandler))
	do := func(method, path, specPath, body string, want int, key bool) map[string]any {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if key {
			req.Header.Set("X-API-KEY", "k")
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Fatalf("%s %s: %d, want %d: %s", method, path, rec.Code, want, rec.Body)
		}
		checkAgainstDoc(t, doc, method, specPath, rec.Result(), rec.Body.Bytes())
		var out map[string]any
		json.Unmarshal(rec.Body.Bytes(), &out)
		return out
	}
	created := do("POST", "/v3/templates", "/v3/templates", `{"name":"web:v1","cpuCount":1,"memoryMB":1024}`, 202, true)
	id, bid := created["templateID"].(string), created["buildID"].(string)
	hash := strings.Repeat("ab", 32)
	files := "/templates/{templateID}/files/{hash}"
	link := do("GET", "/templates/"+id+"/files/"+hash, files, "", 201, true)
	if link["present"] != false {
		t.Errorf("files present before upload: %v", link)
	}
	u, _ := url.Parse(link["url"].(string))
	do("PUT", u.RequestURI(), files, "tar bytes", 200, false) // the link is the credential
	do("PUT", "/templates/"+id+"/files/"+hash+"?expires=99999999999&signature=bad", files, "x", 401, false)
	do("PUT", u.RequestURI(), files, strings.Repeat("x", 2<<10), 507, false)
	if l := do("GET", "/templates/"+id+"/files/"+hash, files, "", 201, true); l["present"] != true {
		t.Errorf("files not present after upload: %v", l)
	}
	start := "/v2/templates/{templateID}/builds/{buildID}"
	do("POST", "/v2/templates/"+id+"/builds/"+bid, start, `{"fromImage":"e2bdev/base","steps":[{"type":"RUN","args":["ls"]}]}`, 202, true)
	do("POST", "/v2/templates/"+id+"/builds/"+bid, start, `{"fromImage":"e2bdev/base"}`, 409, true)
	do("POST", "/v2/templates/"+id+"/builds/nope", start, `{"fromImage":"x"}`, 404, true)
	do("POST", "/v2/templates/"+id+"/builds/"+bid, start, `{"steps":[]}`, 400, true)
	status := "/templates/{templateID}/builds/{buildID}/status"
	waitFor := func(id, bid, want string) map[string]any {
		deadline := time.Now().Add(5 * time.Second)
		for {
			st := do("GET", "/templates/"+id+"/builds/"+bid+"/status?logsOffset=0&limit=100&level=debug", status, "", 200, true)
			if st["status"] == want || time.Now().After(deadline) {
				return st
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if st := waitFor(id, bid, "ready"); st["status"] != "ready" {
		t.Fatalf("build: %v", st)
	}
	do("GET", "/templates/"+id+"/builds/"+bid+"/status?limit=101", status, "", 400, true)
	do("GET", "/templates/"+id+"/builds/"+bid+"/logs?direction=backward&limit=5", "/templates/{templateID}/builds/{buildID}/logs", "", 200, true)
	do("GET", "/templates/"+id+"/builds/"+bid+"/logs?cursor=-1", "/templates/{templateID}/builds/{buildID}/logs", "", 400, true)

	// A failing build reports its step and message.
	bad := do("POST", "/v3/templates", "/v3/templates", `{"name":"broken"}`, 202, true)
	do("POST", "/v2/templates/"+bad["templateID"].(string)+"/builds/"+bad["buildID"].(string), start,
		`{"fromImage":"x","steps":[{"type":"RUN","args":["fail"]}]}`, 202, true)
	st := waitFor(bad["templateID"].(string), bad["buildID"].(string), "error")
	reason, _ := st["reason"].(map[string]any)
	if reason["step"] != "1" || !strings.Contains(reason["message"].(string), "failed to run command 'fail'") {
		t.Errorf("failed build reason: %v", st)
	}

	do("GET", "/v2/templates", "/v2/templates", "", 200, true)
	do("GET", "/templates?teamID=x", "/templates", "", 200, true)
	do("GET", "/v2/templates?limit=0", "/v2/templates", "", 400, true)
	do("GET", "/templates/"+id, "/templates/{templateID}", "", 200, true)
	do("GET", "/templates/base", "/templates/{templateID}", "", 200, true)
	do("GET", "/templates/nope", "/templates/{templateID}", "", 404, true)
	do("PATCH", "/v2/templates/web", "/v2/templates/{templateID}", `{"public":true}`, 200, true)
	do("PATCH", "/templates/web", "/templates/{templateID}", `{}`, 200, true)
	alias := "/templates/aliases/{alias}"
	for name, want := range map[string]int{"base": 200, "code-interpreter-v1": 200, "web": 200, "nope": 404, id: 404} {
		do("GET", "/templates/aliases/"+name, alias, "", want, true)
	}
	do("POST", "/templates/tags", "/templates/tags", `{"target":"web:v1","tags":["prod"]}`, 201, true)
	do("POST", "/templates/tags", "/templates/tags", `{"target":"web:v1","tags":[":bad"]}`, 400, true)
	do("POST", "/templates/tags", "/templates/tags", `{"target":"nope:v1","tags":["x"]}`, 404, true)
	do("GET", "/templates/web/tags", "/templates/{templateID}/tags", "", 200, true)
	do("DELETE", "/templates/tags", "/templates/tags", `{"name":"web","tags":["prod"]}`, 204, true)
	do("GET", "/templates/usage", "/templates/usage", "", 200, true)
	do("POST", "/v2/templates", "/v2/templates", `{"alias":"legacy"}`, 202, true)
	do("POST", "/v3/templates", "/v3/templates", `{"name":"base"}`, 400, true)
	do("POST", "/v3/templates", "/v3/templates", `{}`, 400, true)
	do("DELETE", "/templates/web", "/templates/{templateID}", "", 204, true)
	do("DELETE", "/templates/web", "/templates/{templateID}", "", 404, true)
	// Without a key, nothing (the upload link aside).
	do("GET", "/v2/templates", "/v2/templates", "", 401, false)
	do("PUT", "/templates/"+id+"/files/"+hash, files, "x", 401, false)
}
