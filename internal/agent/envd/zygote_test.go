package envd

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
)

// inZygote runs script until a zygote serves it (the first may start its
// own shell while the spare is on its way) and returns that run. A zygote's
// command line is exactly bash -l -c zygoteBoot (a fresh shell's holds the
// script, zygoteBoot's text included).
func inZygote(t *testing.T, e *env, script string) *result {
	t.Helper()
	for range 50 {
		r, err := e.start(ctxTimeout(t, 20*time.Second), bash(`[ "$(tr '\0' ' ' </proc/$$/cmdline)" = '/bin/bash -l -c `+zygoteBoot+` ' ] && echo Z; `+script), nil)
		if err != nil {
			t.Fatal(err)
		}
		if out, ok := strings.CutPrefix(r.stdout.String(), "Z\n"); ok {
			r.stdout.Reset()
			r.stdout.WriteString(out)
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no zygote served a login command")
	return nil
}

func TestZygoteRunsLoginCommandsExactly(t *testing.T) {
	e := newEnv(t)
	r := inZygote(t, e, `[ -e /proc/$$/fd/3 ] && echo fd3 open; echo "$PWD"; exit 7`)
	if r.stdout.String() != e.dir+"\n" || r.end.GetExitCode() != 7 {
		t.Errorf("got %q, exit %d; want the workdir and exit 7, fd 3 closed", r.stdout.String(), r.end.GetExitCode())
	}

	// The request's directory and variables, quotes included.
	req := bash(`echo "$PWD|$REQ|$CELLFORK_GLOBAL"`)
	req.Process.Cwd = proto.String("/")
	req.Process.Envs = map[string]string{"REQ": `it's "quoted" $HOME`, "CELLFORK_GLOBAL": "overridden"}
	for range 50 {
		if got, err := e.start(ctxTimeout(t, 20*time.Second), req, nil); err != nil || got.stdout.String() != `/|it's "quoted" $HOME|overridden`+"\n" {
			t.Fatalf("got %q, %v", got.stdout.String(), err)
		}
	}

	// One plain command replaces the shell, as bash -c does: the process
	// is the program (its parent is the agent).
	inZygote(t, e, "true")
	for range 3 {
		r, err := e.start(ctxTimeout(t, 20*time.Second), bash("cat /proc/self/stat"), nil)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(r.stdout.String()[strings.LastIndexByte(r.stdout.String(), ')')+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) {
			t.Errorf("a plain command ran under a shell: stat %q", r.stdout.String())
		}
	}

	// A syntax error ends the shell with 2, as bash -c does.
	r, err := e.start(ctxTimeout(t, 20*time.Second), bash("echo before\necho ("), nil)
	if err != nil || r.stdout.String() != "before\n" || r.end.GetExitCode() != 2 {
		t.Errorf("syntax error: %q, exit %d, %v", r.stdout.String(), r.end.GetExitCode(), err)
	}
}

func TestZygoteSeesProfileChanges(t *testing.T) {
	e := newEnv(t)
	inZygote(t, e, "true")
	// A spare is waiting now; the profile changes under it.
	if err := os.WriteFile(filepath.Join(e.dir, ".profile"), []byte("export FROM_PROFILE=yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := e.start(ctxTimeout(t, 20*time.Second), bash(`echo "$FROM_PROFILE"`), nil)
	if err != nil || r.stdout.String() != "yes\n" {
		t.Fatalf("after a profile change: %q, %v", r.stdout.String(), err)
	}
}

func TestExecs(t *testing.T) {
	for cmd, want := range map[string]bool{
		"sleep 1000":              true,
		"  python3 -c 'print(1)'": true,
		`ls "my dir" *.py`:        true,
		"true":                    false,
		"cd /tmp":                 false,
		"A=1 env":                 false,
		"sleep 1; echo":           false,
		"a | b":                   false,
		"a > f":                   false,
		"echo $HOME":              false,
		`python3 -c "$X"`:         false,
		"a\nb":                    false,
		"a &":                     false,
		"f() { :; }":              false,
		"'quoted' prog":           false,
		"unterminated 'x":         false,
		"x `date`":                false,
		`a \; b`:                  false,
		"":                        false,
	} {
		if got := execs(cmd); got != want {
			t.Errorf("execs(%q) = %v, want %v", cmd, got, want)
		}
	}
}

// The spare started before /init serves the first command after it (a
// pool hit's: the warm image's spare, /init setting the sandbox's own
// variables), with the new variables; one started with other login
// variables (LANG here) does not.
func TestZygoteServesAfterInit(t *testing.T) {
	e := newEnv(t)
	isZygote := `[ "$(tr '\0' ' ' </proc/$$/cmdline)" = '/bin/bash -l -c ` + zygoteBoot + ` ' ] && echo Z; `
	first := func(script string) string {
		r, err := e.start(ctxTimeout(t, 20*time.Second), bash(isZygote+script), nil)
		if err != nil {
			t.Fatal(err)
		}
		return r.stdout.String()
	}
	for _, c := range []struct{ init, want string }{
		{`{"envVars":{"E2B_SANDBOX_ID":"sbx-1"}}`, "Z\nsbx-1|g\n"},
		{`{"envVars":{"E2B_SANDBOX_ID":"sbx-2","LANG":"C.UTF-8"}}`, "sbx-2|g\n"},
	} {
		inZygote(t, e, "true")
		time.Sleep(100 * time.Millisecond) // the spare behind it is up
		if res, b := e.do("POST", "/init", nil, strings.NewReader(c.init), nil); res.StatusCode != 204 {
			t.Fatalf("init %d %s", res.StatusCode, b)
		}
		if got := first(`echo "$E2B_SANDBOX_ID|$CELLFORK_GLOBAL"`); got != c.want {
			t.Errorf("after init %s: %q, want %q", c.init, got, c.want)
		}
	}
}
