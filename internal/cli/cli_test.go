package cli

import (
	"context"
	"flag"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		stopAfter int
		wantPos   []string
		wantUser  string
		wantJSON  bool
		wantErr   bool
	}{
		{name: "flags anywhere", args: []string{"a", "--user", "root", "b", "--json"}, wantPos: []string{"a", "b"}, wantUser: "root", wantJSON: true},
		{name: "equals form", args: []string{"--user=x", "a"}, wantPos: []string{"a"}, wantUser: "x"},
		{name: "single dash", args: []string{"-user", "x", "-json", "a"}, wantPos: []string{"a"}, wantUser: "x", wantJSON: true},
		{name: "double dash ends flags", args: []string{"a", "--", "--json", "-x"}, wantPos: []string{"a", "--json", "-x"}},
		{name: "lone dash is positional", args: []string{"id", "-"}, wantPos: []string{"id", "-"}},
		{name: "stop after first", args: []string{"--json", "id", "ls", "-la"}, stopAfter: 1, wantPos: []string{"id", "ls", "-la"}, wantJSON: true},
		{name: "stop keeps dash", args: []string{"id", "--", "ls"}, stopAfter: 1, wantPos: []string{"id", "--", "ls"}},
		{name: "unknown flag", args: []string{"--nope"}, wantErr: true},
		{name: "missing value", args: []string{"--user"}, wantErr: true},
		{name: "bool with value", args: []string{"--json=false", "a"}, wantPos: []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			user := fs.String("user", "", "")
			asJSON := fs.Bool("json", false, "")
			pos, err := parseArgs(fs, tt.args, tt.stopAfter)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if !slices.Equal(pos, tt.wantPos) || *user != tt.wantUser || *asJSON != tt.wantJSON {
				t.Errorf("got pos %q user %q json %v, want %q %q %v", pos, *user, *asJSON, tt.wantPos, tt.wantUser, tt.wantJSON)
			}
		})
	}
}

func TestKVFlag(t *testing.T) {
	var k kvFlag
	for _, s := range []string{"A=1", "B=x=y", "C="} {
		if err := k.Set(s); err != nil {
			t.Fatalf("Set(%q): %v", s, err)
		}
	}
	if k.m["A"] != "1" || k.m["B"] != "x=y" || k.m["C"] != "" || len(k.m) != 3 {
		t.Errorf("got %v", k.m)
	}
	for _, bad := range []string{"A", "=v", ""} {
		if err := k.Set(bad); err == nil {
			t.Errorf("Set(%q) succeeded, want error", bad)
		}
	}
	if w := k.wire(); len(w) != 3 || *w["B"] != "x=y" || *w["C"] != "" {
		t.Errorf("wire() = %v", w)
	}
	var empty kvFlag
	if m := empty.wire(); m != nil {
		t.Errorf("wire() = %v, want nil (the key left out)", m)
	}
}

func TestHelpAndUsageErrors(t *testing.T) {
	tests := []struct {
		args     []string
		wantCode int
		wantOut  string // substring of stdout
		wantErr  string // substring of stderr
	}{
		{args: []string{"help"}, wantCode: 0, wantOut: "Usage: cellfork [global flags]"},
		{args: []string{"-h"}, wantCode: 0, wantOut: "Commands:"},
		{args: []string{"--help"}, wantCode: 0, wantOut: "Commands:"},
		{args: []string{"help", "exec"}, wantCode: 0, wantOut: "Usage: cellfork exec"},
		{args: []string{"help", "sandbox", "list"}, wantCode: 0, wantOut: "Usage: cellfork sandbox list"},
		{args: []string{"sandbox", "create", "-h"}, wantCode: 0, wantOut: "Usage: cellfork sandbox create"},
		{args: []string{"run-code", "--help"}, wantCode: 0, wantOut: "Usage: cellfork run-code"},
		{args: []string{}, wantCode: 2, wantErr: "cellfork: missing command"},
		{args: []string{"frobnicate"}, wantCode: 2, wantErr: `unknown command "frobnicate"`},
		{args: []string{"help", "nope"}, wantCode: 2, wantErr: `no help for "nope"`},
		{args: []string{"sandbox"}, wantCode: 2, wantErr: "missing sandbox subcommand"},
		{args: []string{"sandbox", "pause"}, wantCode: 2, wantErr: `unknown sandbox subcommand "pause"`},
		{args: []string{"sandbox", "create", "--timeout", "abc"}, wantCode: 2, wantErr: "invalid value"},
		{args: []string{"sandbox", "create", "--env", "NOEQUALS"}, wantCode: 2, wantErr: "want K=V"},
		{args: []string{"sandbox", "create", "extra"}, wantCode: 2, wantErr: `unexpected argument "extra"`},
		{args: []string{"sandbox", "kill"}, wantCode: 2, wantErr: "missing sandbox id"},
		{args: []string{"sandbox", "list", "--bogus"}, wantCode: 2, wantErr: "flag provided but not defined: -bogus"},
		{args: []string{"exec"}, wantCode: 2, wantErr: "missing sandbox id"},
		{args: []string{"exec", "sbx1"}, wantCode: 2, wantErr: "missing command"},
		{args: []string{"exec", "sbx1", "--"}, wantCode: 2, wantErr: "missing command"},
		{args: []string{"exec", "--timeout", "-1", "sbx1", "ls"}, wantCode: 2, wantErr: "must not be negative"},
		{args: []string{"run-code", "sbx1"}, wantCode: 2, wantErr: "want a sandbox id and code"},
		{args: []string{"run-code", "sbx1", "print(1)", "x"}, wantCode: 2, wantErr: "quote the code"},
		{args: []string{"run-code", "--language", "js", "--context", "c", "s", "1"}, wantCode: 2, wantErr: "mutually exclusive"},
		{args: []string{"--url", "ftp://x", "sandbox", "list"}, wantCode: 2, wantErr: "invalid --url"},
		{args: []string{"help", "snapshot", "tree"}, wantCode: 0, wantOut: "Usage: cellfork snapshot tree"},
		{args: []string{"help", "fork"}, wantCode: 0, wantOut: "Usage: cellfork fork"},
		{args: []string{"resume", "-h"}, wantCode: 0, wantOut: "Usage: cellfork resume"},
		{args: []string{"snapshot", "create", "--help"}, wantCode: 0, wantOut: "Usage: cellfork snapshot create"},
		{args: []string{"sandbox", "create", "--template", "a", "--snapshot", "b"}, wantCode: 2, wantErr: "mutually exclusive"},
		{args: []string{"sandbox", "create", "--snapshot", ""}, wantCode: 2, wantErr: "must not be empty"},
		{args: []string{"snapshot"}, wantCode: 2, wantErr: "missing snapshot subcommand"},
		{args: []string{"snapshot", "frob"}, wantCode: 2, wantErr: `unknown snapshot subcommand "frob"`},
		{args: []string{"snapshot", "create"}, wantCode: 2, wantErr: "missing sandbox id"},
		{args: []string{"snapshot", "create", "a", "b"}, wantCode: 2, wantErr: `unexpected argument "b"`},
		{args: []string{"snapshot", "list", "x"}, wantCode: 2, wantErr: `unexpected argument "x"`},
		{args: []string{"snapshot", "tree", "x"}, wantCode: 2, wantErr: `unexpected argument "x"`},
		{args: []string{"snapshot", "rm"}, wantCode: 2, wantErr: "missing snapshot id"},
		{args: []string{"snapshot", "usage", "x"}, wantCode: 2, wantErr: `unexpected argument "x"`},
		{args: []string{"fork"}, wantCode: 2, wantErr: "missing sandbox id"},
		{args: []string{"fork", "-n", "0", "s"}, wantCode: 2, wantErr: "-n must be at least 1"},
		{args: []string{"fork", "--timeout", "-5", "s"}, wantCode: 2, wantErr: "must not be negative"},
		{args: []string{"rollback", "s"}, wantCode: 2, wantErr: "want a sandbox id and a snapshot"},
		{args: []string{"merge", "p"}, wantCode: 2, wantErr: "want a parent and a child"},
		{args: []string{"pause"}, wantCode: 2, wantErr: "missing sandbox id"},
		{args: []string{"pause", "--spill=maybe", "s"}, wantCode: 2, wantErr: "invalid boolean value"},
		{args: []string{"resume", "a", "b"}, wantCode: 2, wantErr: `unexpected argument "b"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, out, errOut := runCLI(context.Background(), nil, "", tt.args...)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tt.wantCode, errOut)
			}
			if !strings.Contains(out, tt.wantOut) {
				t.Errorf("stdout %q does not contain %q", out, tt.wantOut)
			}
			if !strings.Contains(errOut, tt.wantErr) {
				t.Errorf("stderr %q does not contain %q", errOut, tt.wantErr)
			}
			if tt.wantCode == 2 && !strings.Contains(errOut, "Usage:") {
				t.Errorf("usage error without usage text: %q", errOut)
			}
		})
	}
}

func TestParseAPIError(t *testing.T) {
	h := http.Header{"X-Request-Id": {"req-7"}}
	tests := []struct {
		status int
		header http.Header
		body   string
		want   string
	}{
		{404, h, `{"code":404,"message":"sandbox x not found"}`, "sandbox x not found (request req-7)"},
		{502, h, `{"sandboxId":"x","message":"The sandbox was not found","code":502}`, "The sandbox was not found (request req-7)"},
		{400, h, `{"code":"invalid_argument","message":"bad path"}`, "bad path (request req-7)"},
		{404, http.Header{}, "Context not found\n", "404 Not Found: Context not found"},
		{500, http.Header{}, "", "500 Internal Server Error"},
		{401, h, `{"code":401}`, `401 Unauthorized: {"code":401} (request req-7)`},
	}
	for _, tt := range tests {
		if got := parseAPIError(tt.status, tt.header, []byte(tt.body)).Error(); got != tt.want {
			t.Errorf("parseAPIError(%d, %q) = %q, want %q", tt.status, tt.body, got, tt.want)
		}
	}
}

func TestDaemonErrorPrinting(t *testing.T) {
	d := newFakeDaemon(t)
	// Wrong API key: the daemon's 401 message and request id, exit 1.
	code, out, errOut := runCLI(context.Background(),
		map[string]string{"CELLFORK_URL": d.srv.URL, "CELLFORK_API_KEY": "wrong"}, "", "sandbox", "list")
	if code != 1 || out != "" || errOut != "cellfork: invalid API key (request req-GET)\n" {
		t.Errorf("got code %d stdout %q stderr %q", code, out, errOut)
	}
	// --api-key and --url flags override the environment.
	code, _, errOut = runCLI(context.Background(), map[string]string{"CELLFORK_API_KEY": "wrong"}, "",
		"--url", d.srv.URL+"/", "sandbox", "kill", "--api-key", testKey, "sbx1")
	if code != 0 {
		t.Errorf("flags did not override env: code %d stderr %q", code, errOut)
	}
}

func TestUnreachableDaemon(t *testing.T) {
	env := map[string]string{"CELLFORK_URL": "http://127.0.0.1:1"}
	code, _, errOut := runCLI(context.Background(), env, "", "sandbox", "list")
	if code != 1 || !strings.HasPrefix(errOut, "cellfork: cannot reach the daemon at http://127.0.0.1:1: ") {
		t.Errorf("got code %d stderr %q", code, errOut)
	}
}
