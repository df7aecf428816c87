package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/envd/process"
)

func TestShellQuote(t *testing.T) {
	tests := map[string]string{
		"":            "''",
		"ls":          "ls",
		"/usr/bin/x":  "/usr/bin/x",
		"-la":         "-la",
		"a b":         "'a b'",
		"it's":        `'it'\''s'`,
		"$HOME":       "'$HOME'",
		"A=b":         "'A=b'",
		"~":           "'~'",
		"%1":          "'%1'",
		"*":           "'*'",
		"a\nb":        "'a\nb'",
		"héllo":       "'héllo'",
		"user@host:x": "user@host:x",
	}
	for in, want := range tests {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestShellJoinRoundTrip checks with a real bash that the joined string
// runs exactly the given argv.
func TestShellJoinRoundTrip(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash not installed")
	}
	args := []string{"printf", "%s\\n", "", "a b", "it's", `"dq"`, "$HOME", "`id`", "$(id)", "A=b", "~", "*", "a\nb",
		"back\\slash", "!bang", "semi;colon", "pipe|x", "&amp", "<in>", "{a,b}", "#hash", "tab\there", "héllo", "'''"}
	out, err := exec.Command(bash, "-c", shellJoin(args)).Output()
	if err != nil {
		t.Fatalf("bash -c %q: %v", shellJoin(args), err)
	}
	if want := strings.Join(args[2:], "\n") + "\n"; string(out) != want {
		t.Errorf("bash printed %q, want %q", out, want)
	}
	// The first word is a command, never an assignment.
	if err := exec.Command(bash, "-c", shellJoin([]string{"A=b"})).Run(); err == nil {
		t.Error("A=b ran as an assignment")
	}
}

func TestParseExec(t *testing.T) {
	tests := []struct {
		args    []string
		id      string
		cmd     []string
		user    string
		timeout int
	}{
		{args: []string{"sbx", "--", "ls", "-la"}, id: "sbx", cmd: []string{"ls", "-la"}, timeout: 60},
		{args: []string{"sbx", "ls", "-la"}, id: "sbx", cmd: []string{"ls", "-la"}, timeout: 60},
		{args: []string{"--user", "root", "--timeout", "0", "sbx", "whoami"}, id: "sbx", cmd: []string{"whoami"}, user: "root"},
		{args: []string{"sbx", "--user", "root", "--", "whoami"}, id: "sbx", cmd: []string{"whoami"}, user: "root", timeout: 60},
		{args: []string{"sbx", "echo", "--", "x"}, id: "sbx", cmd: []string{"echo", "--", "x"}, timeout: 60},
		{args: []string{"sbx", "--", "echo", "--", "x"}, id: "sbx", cmd: []string{"echo", "--", "x"}, timeout: 60},
		{args: []string{"--", "sbx", "ls"}, id: "sbx", cmd: []string{"ls"}, timeout: 60},
	}
	for _, tt := range tests {
		a := &app{}
		o, err := a.parseExec(tt.args)
		if err != nil {
			t.Errorf("parseExec(%q): %v", tt.args, err)
			continue
		}
		if o.id != tt.id || !slices.Equal(o.cmd, tt.cmd) || o.user != tt.user || o.timeout != tt.timeout {
			t.Errorf("parseExec(%q) = id %q cmd %q user %q timeout %d", tt.args, o.id, o.cmd, o.user, o.timeout)
		}
	}
	if _, err := (&app{}).parseExec([]string{"sbx", "--user", "root", "x", "--", "whoami"}); err == nil {
		t.Error("stray argument before -- accepted")
	}
}

func TestExecStreamsOutput(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "exec", "--user", "root", "--cwd", "/tmp", "--env", "A=1", "sbx1", "--", "echo", "hi")
	if code != 0 || out != "hi\n" || errOut != "oops\n" {
		t.Fatalf("got code %d stdout %q stderr %q", code, out, errOut)
	}
	start, h, _, _ := d.proc.snapshot()
	if start.GetProcess().GetCmd() != "/bin/bash" || !slices.Equal(start.GetProcess().GetArgs(), []string{"-l", "-c", "echo hi"}) {
		t.Errorf("process %v", start.GetProcess())
	}
	if start.GetProcess().GetCwd() != "/tmp" || start.GetProcess().GetEnvs()["A"] != "1" || start.Stdin == nil || *start.Stdin {
		t.Errorf("start request %v", start)
	}
	if h.Get("Authorization") != "Basic cm9vdDo=" || h.Get("E2b-Sandbox-Id") != "sbx1" || h.Get("Content-Type") != "application/connect+json" {
		t.Errorf("headers %v", h)
	}
	if r := d.last("POST", "/v2/sandboxes/sbx1/connect"); r.Body != "{}" || r.Header.Get("X-API-KEY") != testKey {
		t.Errorf("connect request %+v", r)
	}
}

func TestExecExitCodes(t *testing.T) {
	d := newFakeDaemon(t)
	tests := []struct {
		script   string
		wantCode int
		wantErr  string
	}{
		{"exit3", 3, ""},
		{"killed", 137, ""},
		{"unknown-script", 127, "cellfork: unknown script\n"},
		{"noend", 1, "cellfork: command ended without an end event\n"},
		{"fail", 1, "cellfork: boom (request req-POST)\n"},
	}
	for _, tt := range tests {
		code, _, errOut := d.run(context.Background(), "", "exec", "sbx1", "--", tt.script)
		if code != tt.wantCode || errOut != tt.wantErr {
			t.Errorf("%s: code %d stderr %q, want %d %q", tt.script, code, errOut, tt.wantCode, tt.wantErr)
		}
	}
}

func TestExecErrors(t *testing.T) {
	d := newFakeDaemon(t)
	code, _, errOut := d.run(context.Background(), "", "exec", "missing", "--", "ls")
	if code != 1 || errOut != "cellfork: sandbox missing not found (request req-POST)\n" {
		t.Errorf("missing: code %d stderr %q", code, errOut)
	}
	// The proxy's JSON error on a streaming call reaches the user intact.
	code, _, errOut = d.run(context.Background(), "", "exec", "gone", "--", "ls")
	if code != 1 || errOut != "cellfork: The sandbox was not found (request req-POST)\n" {
		t.Errorf("gone: code %d stderr %q", code, errOut)
	}
}

func TestExecJSON(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "exec", "--json", "sbx1", "--", "echo hi")
	if code != 0 || errOut != "" {
		t.Fatalf("code %d stderr %q", code, errOut)
	}
	want := `{"type":"start","pid":42}
{"type":"stdout","text":"hi\n"}
{"type":"stderr","text":"oops\n"}
{"type":"end","exitCode":0,"exited":true,"status":"exit status 0"}
`
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	for line := range strings.Lines(out) {
		if !json.Valid([]byte(line)) {
			t.Errorf("invalid JSON line %q", line)
		}
	}
	// "echo hi" is one argument, so it is quoted as one word.
	if start, _, _, _ := d.proc.snapshot(); start.GetProcess().GetArgs()[2] != "'echo hi'" {
		t.Errorf("script %q", start.GetProcess().GetArgs()[2])
	}
}

func TestExecTimeoutKillsProcess(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "exec", "--timeout", "1", "sbx1", "sleep")
	if code != 1 || out != "zz\n" || errOut != "cellfork: command timed out after 1s\n" {
		t.Errorf("code %d stdout %q stderr %q", code, out, errOut)
	}
	if _, _, _, sigs := d.proc.snapshot(); !slices.Equal(sigs, []uint32{42}) {
		t.Errorf("signals sent to pids %v, want [42]", sigs)
	}
}

func TestExecInterruptKillsProcess(t *testing.T) {
	d := newFakeDaemon(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	a := &app{stdin: strings.NewReader(""), stdout: out, stderr: io.Discard, getenv: func(k string) string {
		return map[string]string{"CELLFORK_URL": d.srv.URL, "CELLFORK_API_KEY": testKey}[k]
	}}
	done := make(chan int)
	go func() { done <- a.main(ctx, []string{"exec", "--timeout", "0", "sbx1", "sleep"}) }()
	// Poll until the output after the start event has arrived.
	for deadline := time.Now().Add(10 * time.Second); out.String() != "zz\n"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no output from the command")
		}
	}
	cancel()
	if code := <-done; code != 130 {
		t.Errorf("exit %d, want 130", code)
	}
	if _, _, _, sigs := d.proc.snapshot(); !slices.Equal(sigs, []uint32{42}) {
		t.Errorf("signals sent to pids %v, want [42]", sigs)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestExitCode(t *testing.T) {
	str := func(s string) *string { return &s }
	tests := []struct {
		end  *process.ProcessEvent_EndEvent
		want int
	}{
		{&process.ProcessEvent_EndEvent{Exited: true, Status: "exit status 0"}, 0},
		{&process.ProcessEvent_EndEvent{Exited: true, ExitCode: 2}, 2},
		{&process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: terminated"}, 143},
		{&process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: segmentation fault (core dumped)"}, 139},
		{&process.ProcessEvent_EndEvent{Status: "exit status 5"}, 5},
		{&process.ProcessEvent_EndEvent{ExitCode: 9, Status: "weird"}, 9},
		{&process.ProcessEvent_EndEvent{Status: "signal: nonsense", Error: str("x")}, 1},
	}
	for _, tt := range tests {
		if got := exitCode(tt.end); got != tt.want {
			t.Errorf("exitCode(%v) = %d, want %d", tt.end, got, tt.want)
		}
	}
}
