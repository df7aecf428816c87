package codeinterp

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestSplitter(t *testing.T) {
	mark := "\x1ecellfork:abc\x1e"
	cases := []struct {
		name   string
		chunks []string
		want   string // text, with | for each mark
	}{
		{"plain", []string{"hello\n"}, "hello\n"},
		{"mark at end", []string{"hi" + mark}, "hi|"},
		{"mark split", []string{"hi\x1ecell", "fork:abc\x1etail"}, "hi|tail"},
		{"mark byte by byte", strings.Split("a"+mark+"b", ""), "a|b"},
		{"two marks", []string{mark + mark}, "||"},
		{"lookalike", []string{"\x1ecellfork:abd\x1e", mark}, "\x1ecellfork:abd\x1e|"},
		{"record separator before mark", []string{"x\x1e", mark}, "x\x1e|"},
		{"utf-8 split", []string{"h\xc3", "\xa9llo", mark}, "héllo|"},
		{"utf-8 split 4", []string{"\xf0\x9f", "\x98\x80", mark}, "😀|"},
	}
	for _, c := range cases {
		sp := splitter{mark: []byte(mark)}
		var got strings.Builder
		var pieces []string
		for _, ch := range c.chunks {
			sp.feed([]byte(ch), func(b []byte) {
				got.Write(b)
				pieces = append(pieces, string(b))
			}, func() { got.WriteByte('|') })
		}
		got.Write(sp.flush())
		if got.String() != c.want {
			t.Errorf("%s: %q, want %q", c.name, got.String(), c.want)
		}
		for _, p := range pieces {
			if !utf8.ValidString(p) && utf8.ValidString(c.want) {
				t.Errorf("%s: piece %q cuts a character", c.name, p)
			}
		}
	}
}

func TestFrameCommand(t *testing.T) {
	got := frameCommand(7, "echo hé\n", map[string]string{"B": "2", "A": ""}, map[string]string{"T": "x\ny"})
	want := "7 2 1\n9\necho hé\n1\nA0\n1\nB1\n2" + "1\nT3\nx\ny"
	if string(got) != want {
		t.Errorf("frame = %q, want %q", got, want)
	}
}

func TestOutputLine(t *testing.T) {
	line := outputLine("stdout", []byte("a\"b\n"), time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC))
	want := `{"type":"stdout","text":"a\"b\n","timestamp":"2026-01-02T03:04:05.000006Z"}` + "\n"
	if string(line) != want {
		t.Errorf("line = %s, want %s", line, want)
	}
}

func TestNormalizeLanguage(t *testing.T) {
	for in, want := range map[string]string{
		"": "python", "Python": "python", "python3": "python", " JS ": "javascript", "javascript": "javascript",
		"ts": "typescript", "TypeScript": "typescript", "R": "r", "java": "java", "bash": "bash",
	} {
		if got, err := normalizeLanguage(in); got != want || err != nil {
			t.Errorf("normalizeLanguage(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := normalizeLanguage("sh"); err == nil {
		t.Error("sh accepted")
	}
}

// The bash kernel runs wherever the tests do; it exercises the foreign
// kernel protocol: framed commands, output read from fd 1 and 2 and ended
// by marks, errors, environment, interrupts and crashes.
func TestBashKernel(t *testing.T) {
	h := newHarness(t, "", map[string]string{"SBX": "sandbox", "OVER": "global"})
	bash := func(code string, env map[string]any) outcome {
		t.Helper()
		return h.execute(map[string]any{"code": code, "language": "bash", "env_vars": env})
	}

	o := bash("X=5; echo out; echo err >&2; printf 'no newline'", nil)
	noError(t, o)
	if o.stdout != "out\nno newline" || o.stderr != "err\n" || o.count != 1 {
		t.Errorf("first cell: stdout %q stderr %q count %d", o.stdout, o.stderr, o.count)
	}
	if o = bash("cd /tmp; echo $X $SBX", nil); o.stdout != "5 sandbox\n" {
		t.Errorf("state: %q", o.stdout)
	}
	if o = bash("pwd", nil); o.stdout != "/tmp\n" || o.count != 3 {
		t.Errorf("cwd kept: %q count %d", o.stdout, o.count)
	}
	if o = bash("echo $OVER $TMPV", map[string]any{"OVER": "call", "TMPV": "t"}); o.stdout != "call t\n" {
		t.Errorf("per-call env: %q", o.stdout)
	}
	if o = bash("echo $OVER ${TMPV:-unset}", nil); o.stdout != "global unset\n" {
		t.Errorf("per-call env undone: %q", o.stdout)
	}
	// A non-zero status is an error, as in E2B's bash kernel.
	if o = bash("echo before; false", nil); o.err == nil || o.err.str("value") != "1" || o.stdout != "before\n" {
		t.Errorf("false: %v %q", o.err, o.stdout)
	}
	// Lots of output, and output that looks almost like the mark.
	if o = bash("seq 1 20000; printf '\\x1ecellfork:\\x1e'", nil); !strings.HasPrefix(o.stdout, "1\n2\n") ||
		!strings.HasSuffix(o.stdout, "20000\n\x1ecellfork:\x1e") {
		t.Errorf("flood: %d bytes, ends %q", len(o.stdout), o.stdout[max(0, len(o.stdout)-30):])
	}

	// A client that goes away interrupts the cell; the state survives.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	resp := h.post(ctx, "/execute", map[string]any{"code": "sleep 30; echo late", "language": "bash"})
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	resp.Body.Close()
	cancel()
	start := time.Now()
	if o = bash("echo $X", nil); o.stdout != "5\n" || time.Since(start) > 5*time.Second {
		t.Errorf("after interrupt: %q in %s", o.stdout, time.Since(start))
	}

	// exit ends the kernel: the execution says so, the next one starts a
	// fresh kernel.
	if o = bash("echo bye; exit 3", nil); o.err.str("name") != "UnexpectedEndOfExecution" || o.stdout != "bye\n" {
		t.Errorf("exit: %v %q", o.err, o.stdout)
	}
	if o = bash("echo ${X:-fresh}", nil); o.stdout != "fresh\n" || o.count != 1 {
		t.Errorf("after exit: %q count %d", o.stdout, o.count)
	}

	// A background job's output after its cell ended does not end the next
	// execution early or leak into it as a mark.
	bash("(sleep 0.3; echo background) &", nil)
	time.Sleep(500 * time.Millisecond)
	if o = bash("echo next", nil); o.stdout != "next\n" {
		t.Errorf("after background output: %q", o.stdout)
	}
}

func TestBashContexts(t *testing.T) {
	h := newHarness(t, "", nil)
	dir := t.TempDir()
	c := h.createContext(map[string]any{"language": "bash", "cwd": dir})
	if c.Language != "bash" || c.Cwd != dir {
		t.Fatalf("created %+v", c)
	}
	if o := h.runIn(c.ID, "pwd; Y=1"); o.stdout != dir+"\n" {
		t.Errorf("pwd: %q", o.stdout)
	}
	// The default bash context is another kernel.
	if o := h.execute(map[string]any{"code": "echo ${Y:-none}", "language": "bash"}); o.stdout != "none\n" {
		t.Errorf("default bash context: %q", o.stdout)
	}
	status, body := h.do("GET", "/contexts", nil)
	if status != 200 || !strings.Contains(body, `"language":"bash"`) || !strings.Contains(body, `"language":"javascript"`) {
		t.Errorf("list: %d %s", status, body)
	}
	if status, body := h.do("POST", "/contexts/"+c.ID+"/restart", nil); status/100 != 2 {
		t.Fatalf("restart: %d %s", status, body)
	}
	if o := h.runIn(c.ID, "echo ${Y:-gone}; pwd"); o.stdout != "gone\n"+dir+"\n" {
		t.Errorf("after restart: %q", o.stdout)
	}
}
