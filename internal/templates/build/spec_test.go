package build

import (
	"errors"
	"strings"
	"testing"

	"github.com/cellfork/cellfork/internal/errdefs"
)

const h64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestSpecValidate(t *testing.T) {
	ok := []Spec{
		{FromImage: "ubuntu:22.04"},
		{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{"ls", "root"}}}},
		{FromImageFile: h64, StartCmd: "x", ReadyCmd: "true"},
		{FromImage: "r/x", Registry: &Registry{Type: "registry", Username: "u", Password: "p"}},
		{FromImage: "x", Steps: []Step{
			{Type: "COPY", Args: []string{"folder/*", "dst", "user:group", "0755"}, FilesHash: h64},
			{Type: "env", Args: []string{"A", "1", "B", "$A"}},
			{Type: "WORKDIR", Args: []string{"rel"}},
			{Type: "USER", Args: []string{"app-user", "true"}},
		}},
	}
	for i, s := range ok {
		if err := s.Validate(); err != nil {
			t.Errorf("valid spec %d: %v", i, err)
		}
	}
	bad := map[string]Spec{
		"no base":          {},
		"two bases":        {FromImage: "x", FromTemplate: "y"},
		"bad file hash":    {FromImageFile: "abc"},
		"aws":              {FromImage: "x", Registry: &Registry{Type: "aws"}},
		"registry no pass": {FromImage: "x", Registry: &Registry{Type: "registry", Username: "u"}},
		"unknown step":     {FromImage: "x", Steps: []Step{{Type: "ADD", Args: []string{"a", "b"}}}},
		"run empty":        {FromImage: "x", Steps: []Step{{Type: "RUN", Args: []string{" "}}}},
		"copy no hash":     {FromImage: "x", Steps: []Step{{Type: "COPY", Args: []string{"a", "b"}}}},
		"copy escapes":     {FromImage: "x", Steps: []Step{{Type: "COPY", Args: []string{"../a", "b"}, FilesHash: h64}}},
		"copy absolute":    {FromImage: "x", Steps: []Step{{Type: "COPY", Args: []string{"/etc", "b"}, FilesHash: h64}}},
		"copy bad mode":    {FromImage: "x", Steps: []Step{{Type: "COPY", Args: []string{"a", "b", "", "999"}, FilesHash: h64}}},
		"copy bad owner":   {FromImage: "x", Steps: []Step{{Type: "COPY", Args: []string{"a", "b", "a b"}, FilesHash: h64}}},
		"env odd":          {FromImage: "x", Steps: []Step{{Type: "ENV", Args: []string{"A"}}}},
		"env bad name":     {FromImage: "x", Steps: []Step{{Type: "ENV", Args: []string{"A=B", "1"}}}},
		"user injection":   {FromImage: "x", Steps: []Step{{Type: "USER", Args: []string{"x; rm -rf /"}}}},
		"nul":              {FromImage: "x", StartCmd: "a\x00b"},
		"too many steps":   {FromImage: "x", Steps: make([]Step, MaxSteps+1)},
	}
	for name, s := range bad {
		err := s.Validate()
		if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.UserMessage(err) == "" {
			t.Errorf("%s: %v, want an invalid-argument error with a message", name, err)
		}
	}
	err := (&Spec{FromImage: "x", Steps: []Step{{Type: "RUN", Args: []string{"ok"}}, {Type: "RUN"}}}).Validate()
	if !strings.Contains(errdefs.UserMessage(err), "step 2 (RUN)") {
		t.Errorf("error does not name the step: %v", err)
	}
}

func TestGlobBase(t *testing.T) {
	for in, want := range map[string]string{
		"folder/*":       "folder",
		"folder/*.txt":   "folder",
		"a/b/c.txt":      "a/b/c.txt",
		"*.py":           ".",
		".":              ".",
		"src/**/x":       "src",
		"dir/":           "dir",
		"pkg/[ab]/c":     "pkg",
		"package.json":   "package.json",
		"./app/main.go":  "app/main.go",
		"a/{b,c}/d":      "a",
		"weird\\*/x.txt": ".",
	} {
		if got := globBase(in); got != want {
			t.Errorf("globBase(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCanonicalIgnoresForce(t *testing.T) {
	a := Step{Type: "run", Args: []string{"x"}, Force: true}
	b := Step{Type: "RUN", Args: []string{"x"}}
	if a.canonical() != b.canonical() {
		t.Error("force or the type's case changes the cache key")
	}
	if (Step{Type: "RUN", Args: []string{"x", "root"}}).canonical() == b.canonical() {
		t.Error("the step's user does not change the cache key")
	}
	c1 := Context{User: "u", Env: map[string]string{"A": "1", "B": "2"}}
	c2 := Context{User: "u", Env: map[string]string{"B": "2", "A": "1"}}
	if c1.canonical() != c2.canonical() {
		t.Error("context key depends on map order")
	}
}

func TestShellQuote(t *testing.T) {
	if got := shellQuote(`it's "x" $y`); got != `'it'\''s "x" $y'` {
		t.Errorf("shellQuote = %s", got)
	}
}

func TestLineWriter(t *testing.T) {
	var lines []string
	w := newLineWriter(func(s string, stderr bool) {
		if stderr {
			s = "E:" + s
		}
		lines = append(lines, s)
	})
	w.write([]byte("a\nb"), false)
	w.write([]byte("c\r\n"), false)
	w.write([]byte("err"), true)
	w.flush()
	if got := strings.Join(lines, "|"); got != "a|bc|E:err" {
		t.Errorf("lines = %q", got)
	}
}
