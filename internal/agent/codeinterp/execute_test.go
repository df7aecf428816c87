package codeinterp

import (
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStateAndLastExpression(t *testing.T) {
	h := newHarness(t, "", nil)
	noError(t, h.run("x = 41"))
	o := h.run("x += 1\nx")
	noError(t, o)
	if o.text() != "42" {
		t.Fatalf("text = %q, want 42", o.text())
	}
	if len(o.results) != 1 || o.results[0]["is_main_result"] != true {
		t.Fatalf("results = %v", o.results)
	}
	if o := h.run("'hello'"); o.text() != "hello" {
		t.Errorf("string result %q, want quotes stripped", o.text())
	}
	if o := h.run("None"); len(o.results) != 0 {
		t.Errorf("None displayed: %v", o.results)
	}
	if o := h.run("x;"); len(o.results) != 0 {
		t.Errorf("trailing ; did not silence: %v", o.results)
	}
	if o := h.run("def f():\n    return 7\nf()"); o.text() != "7" {
		t.Errorf("function result %q", o.text())
	}
	if o := h.run("_ * 2"); o.text() != "14" {
		t.Errorf("_ = %q, want the last result", o.text())
	}
	if o := h.run("import asyncio\nawait asyncio.sleep(0)\nawait asyncio.sleep(0, 'tla')"); o.text() != "tla" {
		t.Errorf("top-level await: %q %v", o.text(), o.err)
	}
}

func TestExecutionCount(t *testing.T) {
	h := newHarness(t, "", nil)
	for want := 1; want <= 3; want++ {
		if o := h.run("1"); o.count != want {
			t.Fatalf("execution_count = %d, want %d", o.count, want)
		}
	}
	if o := h.run("raise ValueError"); o.count != 4 {
		t.Fatalf("execution_count after error = %d, want 4", o.count)
	}
}

func TestStdoutStderr(t *testing.T) {
	h := newHarness(t, "", nil)
	o := h.run(`import sys, os
print("a")
print("b", "c", sep="-")
sys.stderr.write("warn\n")
os.system("echo from-shell; echo shell-err >&2")
print("d")
sys.stdout.write("partial")`)
	noError(t, o)
	if o.stdout != "a\nb-c\nfrom-shell\nd\npartial" {
		t.Errorf("stdout = %q", o.stdout)
	}
	if o.stderr != "warn\nshell-err\n" {
		t.Errorf("stderr = %q", o.stderr)
	}
	var chunks []string
	for _, e := range o.events {
		if e.typ() == "stdout" {
			chunks = append(chunks, e.str("text"))
		}
	}
	for _, c := range chunks[:len(chunks)-1] {
		if !strings.HasSuffix(c, "\n") {
			t.Errorf("a line was split across stdout events: %q", chunks)
		}
	}
	o = h.run("import subprocess\nsubprocess.run(['printf', 'sub'])\nprint('!')")
	if o.stdout != "sub!\n" {
		t.Errorf("subprocess stdout = %q", o.stdout)
	}
}

func TestErrors(t *testing.T) {
	h := newHarness(t, "", nil)
	o := h.run("def f():\n    return undefined_name\nf()")
	if o.err == nil {
		t.Fatal("no error")
	}
	if o.err.str("name") != "NameError" || !strings.Contains(o.err.str("value"), "undefined_name") {
		t.Errorf("error = %v", o.err)
	}
	tb := o.err.str("traceback")
	if !strings.Contains(tb, "<cell-1>") || !strings.Contains(tb, "return undefined_name") || strings.Contains(tb, "kernel.py") {
		t.Errorf("traceback:\n%s", tb)
	}
	o = h.run("def (:")
	if o.err.str("name") != "SyntaxError" {
		t.Errorf("syntax error = %v", o.err)
	}
	o = h.run("print('before')\nraise SystemExit(3)")
	if o.err.str("name") != "SystemExit" || o.stdout != "before\n" {
		t.Errorf("SystemExit: %v stdout %q", o.err, o.stdout)
	}
	if o := h.run("1 + 1"); o.text() != "2" {
		t.Errorf("after errors: %q %v", o.text(), o.err)
	}
}

func TestEnvVars(t *testing.T) {
	h := newHarness(t, "", map[string]string{"SANDBOX_WIDE": "yes"})
	o := h.execute(map[string]any{
		"code":     "import os\n(os.environ.get('SANDBOX_WIDE'), os.environ.get('ONLY_NOW'), os.environ['HOME'])",
		"env_vars": map[string]string{"ONLY_NOW": "1"},
	})
	noError(t, o)
	if !strings.HasPrefix(o.text(), "('yes', '1', '/") {
		t.Errorf("env during execution: %s", o.text())
	}
	o = h.run("import os, subprocess\nprint(os.environ.get('ONLY_NOW'), subprocess.run(['sh', '-c', 'echo $SANDBOX_WIDE'], capture_output=True, text=True).stdout.strip())")
	if o.stdout != "None yes\n" {
		t.Errorf("env after execution: %q", o.stdout)
	}
	h.sets.Init("", "", map[string]string{"SANDBOX_WIDE": "changed", "LATER": "2"})
	o = h.run("import os\nos.environ['SANDBOX_WIDE'] + os.environ['LATER']")
	if o.text() != "changed2" {
		t.Errorf("updated sandbox env: %q", o.text())
	}
}

func TestRichResults(t *testing.T) {
	h := newHarness(t, "", nil)
	o := h.run(`class Rich:
    def _repr_html_(self): return "<b>hi</b>"
    def _repr_png_(self): return b"\x89PNG"
    def _repr_markdown_(self): return "**hi**", {"meta": 1}
    def _repr_json_(self): return {"a": [1, 2]}
    def _repr_mimebundle_(self, include=None, exclude=None): return {"application/x-custom": "c"}
    def __repr__(self): return "Rich()"
display(Rich())
Rich()`)
	noError(t, o)
	if len(o.results) != 2 {
		t.Fatalf("results = %v", o.results)
	}
	for n, r := range o.results {
		if r.str("html") != "<b>hi</b>" || r.str("png") != "iVBORw==" || r.str("markdown") != "**hi**" || r.str("text") != "Rich()" {
			t.Errorf("result %d = %v", n, r)
		}
		if j, _ := r["json"].(map[string]any); j == nil || len(j["a"].([]any)) != 2 {
			t.Errorf("json = %v", r["json"])
		}
		if x, _ := r["extra"].(map[string]any); x["application/x-custom"] != "c" {
			t.Errorf("extra = %v", r["extra"])
		}
		if _, ok := r["svg"]; ok {
			t.Errorf("None fields must be omitted: %v", r)
		}
	}
	if o.results[0]["is_main_result"] != false || o.results[1]["is_main_result"] != true {
		t.Errorf("is_main_result: %v", o.results)
	}
	o = h.run("class Broken:\n    def _repr_html_(self): raise RuntimeError('x')\nBroken()")
	noError(t, o)
	if len(o.results) != 1 || o.results[0]["html"] != nil || !strings.Contains(o.results[0].str("text"), "Broken object") {
		t.Errorf("broken formatter: %v", o.results)
	}
	if o := h.run("Rich"); o.results[0]["html"] != nil {
		t.Errorf("a class is shown as text only: %v", o.results)
	}
}

// TestOutputFlood: a burst of prints is coalesced into few events, and big
// outputs arrive whole.
func TestOutputFlood(t *testing.T) {
	h := newHarness(t, "", nil)
	start := time.Now()
	o := h.run("for i in range(100000): print(i)")
	chunks := 0
	for _, e := range o.events {
		if e.typ() == "stdout" {
			chunks++
		}
	}
	if len(o.stdout) != 588890 || chunks > 10000 {
		t.Errorf("100k prints: %d bytes in %d events", len(o.stdout), chunks)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("100k prints took %v", d)
	}
	if o := h.run("import os\nprint('x' * 5_000_000)\nos.system('seq 1 100000 | wc -l')"); o.stdout != strings.Repeat("x", 5e6)+"\n100000\n" {
		t.Errorf("big output: %d bytes", len(o.stdout))
	}
}

// TestKernelSurvivesBadEnv: a variable os.environ refuses (the HTTP layer
// refuses them first; this is the kernel's own guard) is the cell's error:
// the kernel keeps its state and never hangs. Before, it died, and
// sometimes hung in interpreter shutdown, so the execution never ended.
func TestKernelSurvivesBadEnv(t *testing.T) {
	h := newHarness(t, "", nil)
	noError(t, h.run("kept = 7"))
	c, err := h.ip.defaultContext(Python)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		k, err := c.kernel(context.Background(), h.ip.spawnSpec)
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{"OK_" + strconv.Itoa(i): "1", [...]string{"", "A=B", "NUL"}[i%3]: "x"}
		if i%3 == 2 {
			env["NUL"] = "a\x00b"
		}
		cmd, _ := k.command("kept", nil, env)
		rec := httptest.NewRecorder()
		done := make(chan struct{})
		go func() {
			defer close(done)
			k.run(context.Background(), cmd, newNDJSON(rec, h.ip.log), h.ip.timing)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("run %d: no end after 10 s: %s", i, rec.Body)
		}
		if !strings.Contains(rec.Body.String(), `"type":"error"`) || strings.Contains(rec.Body.String(), "UnexpectedEndOfExecution") {
			t.Fatalf("run %d: want the cell's error, kernel alive: %s", i, rec.Body)
		}
	}
	o := h.run("import os\n(kept, [k for k in os.environ if k.startswith('OK_')])")
	if o.text() != "(7, [])" {
		t.Errorf("after bad env: %q %v (state kept, no variable left behind)", o.text(), o.err)
	}
}
