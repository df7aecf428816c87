package codeinterp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/agent"
)

// hostPython is the real binary behind python3 on this host (not a shim).
func hostPython(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(PythonEnv); p != "" {
		return p
	}
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		t.Skipf("no python3 on this host: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func kernelScript(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "kernel.py")
}

// harness is an interpreter served in-process.
type harness struct {
	t    testing.TB
	ip   *Interpreter
	srv  *httptest.Server
	sets *agent.Settings
}

// newHarness serves an interpreter running kernels with python (the host's
// python3 when ""), as the current user.
func newHarness(t testing.TB, python string, envs map[string]string) *harness {
	t.Helper()
	if python == "" {
		python = hostPython(t)
	}
	sets := agent.NewSettings()
	sets.Init(currentUser(t), "", envs)
	ip := New(sets, filepath.Dir(kernelScript(t)))
	ip.python = python
	ip.cacheDir = t.TempDir()
	ip.timing.keepalive = 200 * time.Millisecond
	ip.timing.grace = 500 * time.Millisecond
	srv := httptest.NewServer(ip.Handler())
	h := &harness{t: t, ip: ip, srv: srv, sets: sets}
	t.Cleanup(func() {
		srv.Close()
		h.closeAndCheckLeaks()
	})
	return h
}

// closeAndCheckLeaks closes the interpreter and checks that nothing of its
// kernels' process groups (kernels, shells, sleeps they started) survives.
func (h *harness) closeAndCheckLeaks() {
	groups := map[int]bool{}
	for _, pid := range h.ip.kernelPIDs() {
		groups[pid] = true
	}
	h.ip.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := processesInGroups(groups)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.t.Errorf("processes left after Close: %v", left)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kernelPIDs returns the pids (= process groups) of the live kernels.
func (i *Interpreter) kernelPIDs() []int {
	i.mu.Lock()
	defer i.mu.Unlock()
	var pids []int
	for _, c := range i.contexts {
		c.mu <- struct{}{}
		if c.k != nil {
			pids = append(pids, c.k.pid)
		}
		<-c.mu
	}
	return pids
}

// processesInGroups lists the live (not zombie) processes in groups.
func processesInGroups(groups map[int]bool) []string {
	entries, _ := os.ReadDir("/proc")
	var left []string
	for _, e := range entries {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may contain spaces.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 3 || fields[0] == "Z" {
			continue
		}
		if pgrp, _ := strconv.Atoi(fields[2]); groups[pgrp] {
			left = append(left, e.Name()+" "+string(stat[:bytes.LastIndexByte(stat, ')')+1]))
		}
	}
	return left
}

func currentUser(t testing.TB) string {
	out, err := exec.Command("id", "-un").Output()
	if err != nil {
		t.Fatalf("id -un: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// event is one decoded /execute line.
type event map[string]any

func (e event) typ() string { s, _ := e["type"].(string); return s }
func (e event) str(k string) string {
	s, _ := e[k].(string)
	return s
}

// outcome is a finished execution, shaped like the SDK's Execution.
type outcome struct {
	events  []event
	stdout  string
	stderr  string
	results []event
	err     event
	count   int
}

func (o outcome) text() string {
	for _, r := range o.results {
		if r["is_main_result"] == true {
			return r.str("text")
		}
	}
	return ""
}

// execute posts body to /execute and reads the whole stream.
func (h *harness) execute(body map[string]any) outcome {
	h.t.Helper()
	resp := h.post(context.Background(), "/execute", body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		h.t.Fatalf("POST /execute: %d %s", resp.StatusCode, b)
	}
	return h.readStream(resp.Body, nil)
}

// run executes code in the default context.
func (h *harness) run(code string) outcome {
	h.t.Helper()
	return h.execute(map[string]any{"code": code, "context_id": nil, "language": nil, "env_vars": nil})
}

// runIn executes code in context id.
func (h *harness) runIn(id, code string) outcome {
	h.t.Helper()
	return h.execute(map[string]any{"code": code, "context_id": id, "language": nil, "env_vars": nil})
}

// readStream parses NDJSON as the SDK does, calling each (if set) per event.
func (h *harness) readStream(r io.Reader, each func(event)) outcome {
	h.t.Helper()
	var o outcome
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			h.t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		if each != nil {
			each(e)
		}
		o.events = append(o.events, e)
		switch e.typ() {
		case "stdout":
			o.stdout += e.str("text")
			if e.str("timestamp") == "" {
				h.t.Errorf("stdout without timestamp: %v", e)
			}
		case "stderr":
			o.stderr += e.str("text")
		case "result":
			o.results = append(o.results, e)
		case "error":
			o.err = e
		case "number_of_executions":
			o.count = int(e["execution_count"].(float64))
		}
	}
	if n := len(o.events); n == 0 || o.events[n-1].typ() != "end_of_execution" {
		h.t.Fatalf("stream does not end with end_of_execution: %v", o.events)
	}
	return o
}

func (h *harness) post(ctx context.Context, path string, body any) *http.Response {
	h.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", h.srv.URL+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// do sends a request and returns status and body.
func (h *harness) do(method, path string, body any) (int, string) {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, h.srv.URL+path, rd)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// createContext creates a context and returns its id.
func (h *harness) createContext(body map[string]any) contextInfo {
	h.t.Helper()
	var b any // no body for nil (a nil map would be sent as null)
	if body != nil {
		b = body
	}
	status, out := h.do("POST", "/contexts", b)
	if status != 200 {
		h.t.Fatalf("POST /contexts: %d %s", status, out)
	}
	var info contextInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		h.t.Fatalf("decoding context %q: %v", out, err)
	}
	return info
}

// noError fails the test if o carries an error.
func noError(t testing.TB, o outcome) {
	t.Helper()
	if o.err != nil {
		t.Fatalf("unexpected error %s: %s\n%s", o.err.str("name"), o.err.str("value"), o.err.str("traceback"))
	}
}
