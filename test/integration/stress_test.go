package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestConcurrencyStress runs every pair of lifecycle operations (create,
// snapshot, delete snapshot, fork, rollback, merge, pause, resume, kill,
// list) against each other on the same sandboxes and snapshots, through a
// daemon built with the race detector. It fails on any request that does
// not answer within its bound (a deadlock wedges them all), on any 5xx but
// a 503 (admission), and on any race the daemon reports.
//
// The operations aim at one shared parent sandbox, its snapshots and its
// fork children, so that each pair contends for the same locks.
func TestConcurrencyStress(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "cellfork-race")
	build := exec.Command("go", "build", "-race", "-o", bin, "./cmd/cellfork")
	build.Dir, build.Env = repoRoot, append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the daemon with -race: %v\n%s", err, out)
	}
	dataDir := t.TempDir()
	dm, err := startDaemonBin(bin, dataDir, freeAddr(), "--agent-dir", filepath.Join(repoRoot, "bin"), "--pool-ready", "1", "--pool-shells", "1", "--standby-snapshots", "1", "--spill-after", "2s")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		dm.stop()
		for unix.Unmount(filepath.Join(dataDir, "runsc", "null-netns"), unix.MNT_DETACH) == nil {
		}
		if logs := dm.logs(); strings.Contains(logs, "WARNING: DATA RACE") || strings.Contains(logs, "panic:") {
			i := max(strings.Index(logs, "WARNING: DATA RACE"), strings.Index(logs, "panic:"))
			t.Errorf("the daemon reported a race or panicked:\n%s", logs[i:min(len(logs), i+8000)])
		}
	}()
	w := &world{t: t, url: dm.url, hc: &http.Client{Timeout: stressBound}}
	ops := []string{"create", "snapshot", "deleteSnapshot", "fork", "rollback", "merge", "pause", "resume", "kill", "list"}
	for i, a := range ops {
		for _, b := range ops[i:] {
			if t.Failed() {
				return // a hung daemon fails every later pair too
			}
			w.prepare()
			var wg sync.WaitGroup
			for _, op := range []string{a, b} {
				wg.Go(func() {
					for range 2 {
						w.do(op)
					}
				})
			}
			wg.Wait()
			w.trim()
			t.Logf("%s x %s: ok", a, b)
		}
	}
	w.cleanup()
	if r := w.req("GET", "/v2/sandboxes", nil); r.status != 200 || string(bytes.TrimSpace(r.body)) != "[]" {
		t.Errorf("sandboxes left after the stress: %d %s", r.status, r.body)
	}
}

// stressBound is how long any one request may take: a restore takes about
// 200 ms here, and a handful may queue behind each other.
const stressBound = 45 * time.Second

// world is the shared state the operations act on: a parent sandbox, its
// snapshots, its fork children, sandboxes created from scratch. Safe for
// concurrent use.
type world struct {
	t   *testing.T
	url string
	hc  *http.Client

	mu       sync.Mutex
	parent   string
	snaps    []string
	children []string
	created  []string
}

type stressResp struct {
	status int
	body   []byte
}

// req makes a request and fails the test if it does not answer within the
// bound or answers with a server error other than 503.
func (w *world) req(method, path string, body any) stressResp {
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	r, _ := http.NewRequest(method, w.url+path, rd)
	r.Header.Set("X-API-KEY", apiKey)
	r.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := w.hc.Do(r)
	if err != nil {
		w.t.Errorf("%s %s: no answer after %v: %v", method, path, time.Since(start).Round(time.Millisecond), err)
		return stressResp{}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
		w.t.Errorf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	return stressResp{resp.StatusCode, raw}
}

func (w *world) id(r stressResp, key string) string {
	var m map[string]any
	_ = json.Unmarshal(r.body, &m)
	s, _ := m[key].(string)
	return s
}

func (w *world) pick(list []string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(list) == 0 {
		return "none"
	}
	return list[len(list)-1]
}

// pop removes and returns the newest entry of list, "" if none.
func (w *world) pop(list *[]string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(*list) == 0 {
		return ""
	}
	v := (*list)[len(*list)-1]
	*list = (*list)[:len(*list)-1]
	return v
}

// prepare makes sure the parent runs and has a snapshot and a fork child.
func (w *world) prepare() {
	w.mu.Lock()
	parent := w.parent
	w.mu.Unlock()
	if parent == "" || w.req("GET", "/sandboxes/"+parent, nil).status != 200 {
		r := w.req("POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 600})
		parent = w.id(r, "sandboxID")
		w.mu.Lock()
		w.parent = parent
		w.mu.Unlock()
	}
	// A paused parent is resumed; a parent on disk too.
	w.req("POST", "/sandboxes/"+parent+"/connect", map[string]any{"timeout": 600})
	w.do("snapshot")
	w.do("fork")
}

// do runs one operation.
func (w *world) do(op string) {
	w.mu.Lock()
	parent := w.parent
	w.mu.Unlock()
	switch op {
	case "create":
		body := map[string]any{"templateID": "base", "timeout": 120}
		if sn := w.pick(w.snaps); sn != "none" {
			body["templateID"] = sn // from a snapshot that may be going away
		}
		if id := w.id(w.req("POST", "/v2/sandboxes", body), "sandboxID"); id != "" {
			w.mu.Lock()
			w.created = append(w.created, id)
			w.mu.Unlock()
		}
	case "snapshot":
		if id := w.id(w.req("POST", "/sandboxes/"+parent+"/snapshots", map[string]any{}), "snapshotID"); id != "" {
			w.mu.Lock()
			w.snaps = append(w.snaps, id)
			w.mu.Unlock()
		}
	case "deleteSnapshot":
		w.req("DELETE", "/snapshots/"+w.pick(w.snaps), nil)
	case "fork":
		var kids []struct {
			Sandbox *struct {
				SandboxID string `json:"sandboxID"`
			} `json:"sandbox"`
		}
		r := w.req("POST", "/sandboxes/"+parent+"/fork", map[string]any{"count": 1, "timeout": 120})
		_ = json.Unmarshal(r.body, &kids)
		for _, k := range kids {
			if k.Sandbox != nil {
				w.mu.Lock()
				w.children = append(w.children, k.Sandbox.SandboxID)
				w.mu.Unlock()
			}
		}
	case "rollback":
		w.req("POST", "/sandboxes/"+parent+"/rollback", map[string]any{"snapshotID": w.pick(w.snaps)})
	case "merge":
		w.req("POST", "/sandboxes/"+parent+"/merge", map[string]any{"childID": w.pick(w.children)})
	case "pause":
		w.req("POST", "/sandboxes/"+parent+"/pause", nil)
	case "resume":
		w.req("POST", "/sandboxes/"+parent+"/resume", map[string]any{"timeout": 600})
	case "kill":
		// A child, a created sandbox, or (once both are gone) the parent.
		target := w.pop(&w.children)
		if target == "" {
			target = w.pop(&w.created)
		}
		if target == "" {
			target = parent
		}
		w.req("DELETE", "/sandboxes/"+target, nil)
	case "list":
		w.req("GET", "/v2/sandboxes", nil)
		w.req("GET", "/snapshots", nil)
		w.req("GET", "/sandboxes/"+parent, nil)
	default:
		panic(fmt.Sprintf("unknown op %q", op))
	}
}

// trim kills the fork children and created sandboxes, keeping the parent,
// so that sandboxes do not pile up between pairs.
func (w *world) trim() {
	w.mu.Lock()
	ids := append(w.children, w.created...)
	w.children, w.created = nil, nil
	w.mu.Unlock()
	for _, id := range ids {
		w.req("DELETE", "/sandboxes/"+id, nil)
	}
}

// cleanup kills every sandbox and deletes every snapshot.
func (w *world) cleanup() {
	w.mu.Lock()
	ids := append(append([]string{w.parent}, w.children...), w.created...)
	snaps := w.snaps
	w.mu.Unlock()
	for _, id := range ids {
		w.req("DELETE", "/sandboxes/"+id, nil)
	}
	for _, sn := range snaps {
		w.req("DELETE", "/snapshots/"+sn, nil)
	}
}
