package codeinterp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/agent"
)

func TestContexts(t *testing.T) {
	h := newHarness(t, "", nil)
	dir := t.TempDir()
	a := h.createContext(map[string]any{"cwd": dir})
	if a.ID == "" || a.Language != "python" || a.Cwd != dir {
		t.Fatalf("created %+v", a)
	}
	b := h.createContext(map[string]any{"language": "python"})
	home, _ := os.UserHomeDir()
	if b.Cwd != home {
		t.Errorf("default cwd %q, want %q", b.Cwd, home)
	}
	if o := h.runIn(a.ID, "import os\nos.getcwd()"); o.text() != dir {
		t.Errorf("cwd in context: %q %v", o.text(), o.err)
	}
	h.runIn(a.ID, "v = 'a'")
	h.runIn(b.ID, "v = 'b'")
	h.run("v = 'default'")
	for id, want := range map[string]string{a.ID: "a", b.ID: "b"} {
		if o := h.runIn(id, "v"); o.text() != want {
			t.Errorf("context %s: v = %q, want %q", id, o.text(), want)
		}
	}
	if o := h.execute(map[string]any{"code": "v", "language": "python"}); o.text() != "default" {
		t.Errorf("language python: v = %q", o.text())
	}

	status, body := h.do("GET", "/contexts", nil)
	var list []contextInfo
	if err := json.Unmarshal([]byte(body), &list); status != 200 || err != nil {
		t.Fatalf("GET /contexts: %d %s", status, body)
	}
	// The default python and javascript contexts come first, as in E2B.
	if len(list) != 4 || list[0].Language != "python" || list[1].Language != "javascript" || list[2] != a || list[3] != b {
		t.Fatalf("list = %+v", list)
	}

	if status, body := h.do("POST", "/contexts/"+a.ID+"/restart", nil); status/100 != 2 {
		t.Fatalf("restart: %d %s", status, body)
	}
	if o := h.runIn(a.ID, "v"); o.err.str("name") != "NameError" || o.count != 1 {
		t.Errorf("after restart: %v count %d", o.err, o.count)
	}
	if status, body := h.do("DELETE", "/contexts/"+a.ID, nil); status/100 != 2 {
		t.Fatalf("delete: %d %s", status, body)
	}
	if status, _ := h.do("DELETE", "/contexts/"+a.ID, nil); status != 404 {
		t.Errorf("second delete: %d", status)
	}
	if status, _ := h.do("POST", "/contexts/nope/restart", nil); status != 404 {
		t.Errorf("restart unknown: %d", status)
	}
	_, body = h.do("GET", "/contexts", nil)
	if strings.Contains(body, a.ID) {
		t.Errorf("deleted context still listed: %s", body)
	}
}

func TestRequestErrors(t *testing.T) {
	h := newHarness(t, "", nil)
	cases := []struct {
		name   string
		method string
		path   string
		body   any
		status int
		text   string
	}{
		{"both", "POST", "/execute", map[string]any{"code": "1", "context_id": "x", "language": "python"}, 400, "mutually exclusive"},
		{"unknown context", "POST", "/execute", map[string]any{"code": "1", "context_id": "nope"}, 404, "nope"},
		{"unknown language", "POST", "/execute", map[string]any{"code": "1", "language": "cobol"}, 400, `language "cobol" is not supported`},
		{"bad json", "POST", "/execute", "not an object", 400, "decoding"},
		{"no body", "POST", "/execute", nil, 400, "code is required"},
		{"no code", "POST", "/execute", map[string]any{"language": "python"}, 400, "code is required"},
		{"null code", "POST", "/execute", map[string]any{"code": nil, "context_id": nil}, 400, "code is required"},
		{"empty env name", "POST", "/execute", map[string]any{"code": "1", "env_vars": map[string]any{"": nil}}, 400, "invalid environment variable"},
		{"env name with =", "POST", "/execute", map[string]any{"code": "1", "env_vars": map[string]any{"A=B": "1"}}, 400, "invalid environment variable"},
		{"env value with NUL", "POST", "/execute", map[string]any{"code": "1", "env_vars": map[string]any{"A": "x\x00y"}}, 400, "invalid environment variable"},
		{"create null", "POST", "/contexts", json.RawMessage(`null`), 400, "not null"},
		{"create unknown language", "POST", "/contexts", map[string]any{"language": "cobol"}, 400, "supported: python, javascript, typescript, r, java, bash"},
		{"create bad cwd", "POST", "/contexts", map[string]any{"cwd": "/does/not/exist"}, 400, "does not exist"},
		{"create cwd a file", "POST", "/contexts", map[string]any{"cwd": "/etc/passwd"}, 400, "not a directory"},
		{"health", "GET", "/health", nil, 200, `"OK"`},
	}
	for _, c := range cases {
		status, body := h.do(c.method, c.path, c.body)
		if status != c.status || !strings.Contains(body, c.text) {
			t.Errorf("%s: %d %q, want %d containing %q", c.name, status, body, c.status, c.text)
		}
	}
}

func TestStreamingIsLive(t *testing.T) {
	h := newHarness(t, "", nil)
	noError(t, h.run("None")) // the kernel's start is not the cell's
	start := time.Now()
	var firstAt, partialAt time.Duration
	resp := h.post(context.Background(), "/execute", map[string]any{
		"code": "import time\nprint('first')\nprint('partial', end='')\ntime.sleep(1)\nprint(' second')",
	})
	defer resp.Body.Close()
	keepalives := 0
	o := h.readStream(resp.Body, func(e event) {
		switch {
		case e.typ() == "stdout" && e.str("text") == "first\n":
			firstAt = time.Since(start)
		case e.typ() == "stdout" && e.str("text") == "partial":
			partialAt = time.Since(start)
		case e.typ() == "keepalive":
			keepalives++
		}
	})
	if o.stdout != "first\npartial second\n" {
		t.Errorf("stdout = %q", o.stdout)
	}
	if firstAt == 0 || firstAt > 700*time.Millisecond || partialAt == 0 || partialAt > 700*time.Millisecond {
		t.Errorf("output not live: first at %v, partial line at %v", firstAt, partialAt)
	}
	if keepalives == 0 {
		t.Errorf("no keepalive during a 1 s cell (interval %v)", h.ip.timing.keepalive)
	}
}

// TestInterruptOnDisconnect: the SDK closes the connection at its timeout;
// the cell must stop, and the context keep its state.
func TestInterruptOnDisconnect(t *testing.T) {
	h := newHarness(t, "", nil)
	noError(t, h.run("x = 5"))
	for _, code := range []string{
		"import time\nprint('started', flush=True)\ntime.sleep(60)",
		"import os\nprint('started', flush=True)\nos.system('sleep 60')",
		"print('started', flush=True)\nwhile True: pass",
	} {
		ctx, cancel := context.WithCancel(context.Background())
		resp := h.post(ctx, "/execute", map[string]any{"code": code})
		waitForStdout(t, resp.Body, "started")
		cancel()
		resp.Body.Close()
		start := time.Now()
		o := h.run("x")
		if o.text() != "5" {
			t.Fatalf("after interrupt of %q: %q %v", code, o.text(), o.err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("next execution waited %v", d)
		}
	}
}

func waitForStdout(t *testing.T, body io.Reader, text string) {
	t.Helper()
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), text) {
			return
		}
	}
	t.Fatalf("stream ended before %q", text)
}

// TestInterruptIgnored: a cell that swallows KeyboardInterrupt is killed.
func TestInterruptIgnored(t *testing.T) {
	h := newHarness(t, "", nil)
	ctx, cancel := context.WithCancel(context.Background())
	resp := h.post(ctx, "/execute", map[string]any{"code": `import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
print('started', flush=True)
time.sleep(60)`})
	waitForStdout(t, resp.Body, "started")
	cancel()
	resp.Body.Close()
	start := time.Now()
	if o := h.run("1"); o.text() != "1" {
		t.Fatalf("after killing a stuck kernel: %v", o.err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("recovery took %v", d)
	}
}

func TestKernelCrash(t *testing.T) {
	h := newHarness(t, "", nil)
	// Started on purpose: it must die with its kernel.
	o := h.run("import subprocess\nsubprocess.Popen(['sleep', '300']).pid")
	bg, _ := strconv.Atoi(o.text())
	for _, code := range []string{
		"import os\nprint('bye')\nos._exit(3)",
		"import ctypes\nctypes.string_at(0)",
	} {
		noError(t, h.run("y = 1"))
		o := h.run(code)
		if o.err.str("name") != "UnexpectedEndOfExecution" {
			t.Fatalf("%q: error %v", code, o.err)
		}
		if strings.Contains(code, "bye") && o.stdout != "bye\n" {
			t.Errorf("output before the crash lost: %q", o.stdout)
		}
		o = h.run("y")
		if o.err.str("name") != "NameError" {
			t.Fatalf("after crash: state should be fresh, got %q %v", o.text(), o.err)
		}
		if o := h.run("2 * 21"); o.text() != "42" {
			t.Fatalf("after crash: %q %v", o.text(), o.err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(bg, 0) == nil && !isZombie(bg) {
		if time.Now().After(deadline) {
			t.Fatalf("background process %d of a crashed kernel still runs", bg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isZombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

func TestConcurrency(t *testing.T) {
	h := newHarness(t, "", nil)
	a := h.createContext(nil)
	b := h.createContext(nil)
	sleep := "import time\ntime.sleep(0.8)\n'done'"
	parallel := func(ids ...string) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Go(func() {
				if o := h.runIn(id, sleep); o.text() != "done" {
					t.Errorf("context %s: %q %v", id, o.text(), o.err)
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	if d := parallel(a.ID, b.ID); d > 1500*time.Millisecond {
		t.Errorf("two contexts took %v: not parallel", d)
	}
	if d := parallel(a.ID, a.ID); d < 1600*time.Millisecond {
		t.Errorf("one context ran two cells in %v: not serialized", d)
	}
}

// TestOfficialSDK drives the interpreter with e2b-code-interpreter, when the
// host python has it.
func TestOfficialSDK(t *testing.T) {
	py := hostPython(t)
	if exec.Command(py, "-c", "import e2b_code_interpreter").Run() != nil {
		t.Skip("e2b-code-interpreter is not installed for " + py)
	}
	h := newHarness(t, "", nil)
	out, err := exec.Command(py, "testdata/sdk_client.py", h.srv.URL).CombinedOutput()
	if err != nil {
		t.Fatalf("sdk client: %v\n%s", err, out)
	}
	var r struct {
		Text           string   `json:"text"`
		Stdout         []string `json:"stdout"`
		Stderr         []string `json:"stderr"`
		Live           []string `json:"live"`
		Count          int      `json:"count"`
		Error          []any    `json:"error"`
		Env            string   `json:"env"`
		CtxX           string   `json:"ctx_x"`
		Contexts       int      `json:"contexts"`
		AfterRestart   string   `json:"after_restart"`
		BadLanguage    string   `json:"bad_language"`
		Timeout        string   `json:"timeout"`
		AfterTimeout   string   `json:"after_timeout"`
		TimeoutSeconds float64  `json:"timeout_seconds"`
		AfterSeconds   float64  `json:"after_timeout_seconds"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("report %s: %v", out, err)
	}
	t.Logf("report: %+v", r)
	if r.Text != "42" || strings.Join(r.Stdout, "") != "hello\n" || strings.Join(r.Stderr, "") != "oops\n" ||
		len(r.Live) != 1 || r.Count != 2 {
		t.Errorf("run_code: %+v", r)
	}
	if len(r.Error) != 3 || r.Error[0] != "ZeroDivisionError" || r.Error[2] != true {
		t.Errorf("error: %v", r.Error)
	}
	if r.Env != "yes" || r.CtxX != "ctx" || r.Contexts != 2 || r.AfterRestart != "False" {
		t.Errorf("envs/contexts: %+v", r)
	}
	if r.BadLanguage == "" || r.Timeout != "TimeoutException" || r.AfterTimeout != "41" ||
		r.TimeoutSeconds > 5 || r.AfterSeconds > 5 {
		t.Errorf("language/timeout: %+v", r)
	}
}

// TestRunsAsDefaultUser: kernels run as Settings.User() with its identity
// in the environment. Needs root, the user nobody and /usr/bin/python3.
func TestRunsAsDefaultUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch users")
	}
	acct, err := agent.LookupAccount("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3 (the host python3 may not be readable by nobody)")
	}
	h := newHarness(t, "/usr/bin/python3", nil)
	h.sets.Init("nobody", "", nil)
	dir, err := os.MkdirTemp("", "codeinterp-user-") // t.TempDir's parent is 0700
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o777)
	c := h.createContext(map[string]any{"cwd": dir})
	o := h.runIn(c.ID, "import os\nprint(os.getuid(), os.getgid(), os.environ['USER'], os.environ['HOME'])\nopen('f', 'w').write('x')")
	noError(t, o)
	want := fmt.Sprintf("%d %d nobody %s\n", acct.UID, acct.GID, acct.Home)
	if o.stdout != want {
		t.Errorf("identity %q, want %q", o.stdout, want)
	}
	if st, err := os.Stat(filepath.Join(dir, "f")); err != nil || st.Sys().(*syscall.Stat_t).Uid != acct.UID {
		t.Errorf("file not owned by nobody: %v", err)
	}
}

// TestKernelKilledWhileIdle: a kernel killed between executions (a pkill
// of the user's processes) costs the next execution nothing. An execution
// that reaches the dead kernel before the agent saw it die is not taken
// (the kernel said nothing, so it ran nothing) and runs on a fresh kernel.
// A cell that kills its own kernel is not run again.
func TestKernelKilledWhileIdle(t *testing.T) {
	h := newHarness(t, "", nil)
	noError(t, h.run("x = 1"))
	c, err := h.ip.defaultContext(Python)
	if err != nil {
		t.Fatal(err)
	}
	k, err := c.kernel(context.Background(), h.ip.spawnSpec)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(k.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd, err := k.command("print('ran')", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	if k.run(context.Background(), cmd, newNDJSON(rec, h.ip.log), h.ip.timing) {
		t.Errorf("a kernel killed before the command took it: %s", rec.Body)
	}
	if rec.Body.Len() != 0 {
		t.Errorf("an execution the dead kernel did not take wrote %q", rec.Body)
	}

	for range 5 {
		k, err := c.kernel(context.Background(), h.ip.spawnSpec)
		if err != nil {
			t.Fatal(err)
		}
		_ = syscall.Kill(k.pid, syscall.SIGKILL)
		if o := h.run("print('ok')"); o.stdout != "ok\n" || o.err != nil {
			t.Fatalf("right after the kernel was killed: %q %v", o.stdout, o.err)
		}
	}

	count := filepath.Join(t.TempDir(), "count")
	o := h.run(fmt.Sprintf("import os, signal\nopen(%q, 'a').write('x')\nos.kill(os.getpid(), signal.SIGKILL)", count))
	if o.err.str("name") != "UnexpectedEndOfExecution" {
		t.Fatalf("a cell that killed its kernel: %v", o.err)
	}
	if b, _ := os.ReadFile(count); string(b) != "x" {
		t.Errorf("the cell that killed its kernel ran %d times", len(b))
	}
}
