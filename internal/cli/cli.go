// Package cli is the cellfork command-line client. It talks to a cellfork
// daemon over its E2B-compatible HTTP API: the control plane (/v2/sandboxes…)
// and the data plane the daemon proxies into each sandbox (envd Connect RPC on
// port 49983, the code interpreter on 49999), both on the daemon's one URL.
//
// The package links only the standard library, connect and the envd wire
// contract (internal/envd/...); never daemon, runtime or store code
// (deps_test.go checks this).
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
)

// DefaultURL is the daemon URL used when neither --url nor CELLFORK_URL is set.
const DefaultURL = "http://127.0.0.1:3000"

// Main runs one CLI command. args is os.Args[1:]; the result is the process
// exit code: 0 on success, 1 on errors, 2 on usage errors, 130 when ctx is
// cancelled (interrupted), and for exec the exit code of the command that
// ran in the sandbox.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdin: os.Stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv}
	return a.main(ctx, args)
}

// app is one CLI invocation. Not safe for concurrent use; Main builds a new
// one per call.
type app struct {
	stdin     io.Reader
	stdout    io.Writer
	stderr    io.Writer
	getenv    func(string) string
	transport http.RoundTripper // nil means http.DefaultTransport
	g         globals
}

// globals are the flags every command accepts, before or after its name.
type globals struct {
	url    string
	apiKey string
	json   bool
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.url, "url", g.url, "daemon base `URL` (env CELLFORK_URL)")
	fs.StringVar(&g.apiKey, "api-key", g.apiKey, "API `key` (env CELLFORK_API_KEY)")
	fs.BoolVar(&g.json, "json", g.json, "print machine-readable JSON")
}

// usageError is a bad command line: exit code 2 with the command's usage.
type usageError struct {
	msg   string
	usage string
}

func (e *usageError) Error() string { return e.msg }

// helpRequest is -h/--help or `help`: the usage goes to stdout, exit code 0.
type helpRequest struct{ usage string }

func (e *helpRequest) Error() string { return "help requested" }

// exitError ends the CLI with a given code; its message, if any, has already
// been printed.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func (a *app) main(ctx context.Context, args []string) int {
	err := a.run(ctx, args)
	var (
		help  *helpRequest
		usage *usageError
		exit  *exitError
	)
	switch {
	case err == nil:
		return 0
	case errors.As(err, &help):
		fmt.Fprint(a.stdout, help.usage)
		return 0
	case errors.As(err, &usage):
		fmt.Fprintf(a.stderr, "cellfork: %s\n\n%s", usage.msg, usage.usage)
		return 2
	case errors.As(err, &exit):
		return exit.code
	case ctx.Err() != nil:
		// Interrupted (the caller cancels ctx on SIGINT/SIGTERM); whatever
		// failed after that is a consequence, not news.
		fmt.Fprintln(a.stderr, "cellfork: interrupted")
		return 130
	default:
		fmt.Fprintf(a.stderr, "cellfork: %s\n", err)
		return 1
	}
}

func (a *app) run(ctx context.Context, args []string) error {
	a.g = globals{url: a.getenv("CELLFORK_URL"), apiKey: a.getenv("CELLFORK_API_KEY")}
	if a.g.url == "" {
		a.g.url = DefaultURL
	}
	fs := a.flagSet("cellfork")
	// Global flags come before the command; flag parsing stops at its name.
	if err := fs.Parse(args); err != nil {
		return flagError(err, usageMain)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return &usageError{msg: "missing command", usage: usageMain}
	}
	cmd, rest := rest[0], rest[1:]
	switch cmd {
	case "help":
		return helpFor(rest)
	case "sandbox", "sandboxes", "sbx":
		return a.sandbox(ctx, rest)
	case "exec":
		return a.exec(ctx, rest)
	case "run-code":
		return a.runCode(ctx, rest)
	case "snapshot", "snapshots", "snap":
		return a.snapshot(ctx, rest)
	case "fork":
		return a.fork(ctx, rest)
	case "rollback":
		return a.rollback(ctx, rest)
	case "merge":
		return a.merge(ctx, rest)
	case "pause":
		return a.pause(ctx, rest)
	case "resume":
		return a.resume(ctx, rest)
	case "template", "templates":
		return a.template(ctx, rest)
	default:
		return &usageError{msg: fmt.Sprintf("unknown command %q", cmd), usage: usageMain}
	}
}

func helpFor(topic []string) error {
	if len(topic) == 0 {
		return &helpRequest{usage: usageMain}
	}
	switch strings.Join(topic, " ") {
	case "sandbox", "sandboxes", "sbx":
		return &helpRequest{usage: usageSandbox}
	case "sandbox create":
		return &helpRequest{usage: usageCreate}
	case "sandbox list":
		return &helpRequest{usage: usageList}
	case "sandbox kill":
		return &helpRequest{usage: usageKill}
	case "exec":
		return &helpRequest{usage: usageExec}
	case "run-code":
		return &helpRequest{usage: usageRunCode}
	case "snapshot", "snapshots", "snap":
		return &helpRequest{usage: usageSnapshot}
	case "snapshot create":
		return &helpRequest{usage: usageSnapshotCreate}
	case "snapshot list":
		return &helpRequest{usage: usageSnapshotList}
	case "snapshot get":
		return &helpRequest{usage: usageSnapshotGet}
	case "snapshot tree":
		return &helpRequest{usage: usageSnapshotTree}
	case "snapshot rm":
		return &helpRequest{usage: usageSnapshotRemove}
	case "snapshot usage":
		return &helpRequest{usage: usageSnapshotUsage}
	case "fork":
		return &helpRequest{usage: usageFork}
	case "rollback":
		return &helpRequest{usage: usageRollback}
	case "merge":
		return &helpRequest{usage: usageMerge}
	case "pause":
		return &helpRequest{usage: usagePause}
	case "resume":
		return &helpRequest{usage: usageResume}
	case "template", "templates":
		return &helpRequest{usage: usageTemplate}
	case "template build":
		return &helpRequest{usage: usageTemplateBuild}
	case "template import":
		return &helpRequest{usage: usageTemplateImport}
	case "template list":
		return &helpRequest{usage: usageTemplateList}
	case "template delete":
		return &helpRequest{usage: usageTemplateDelete}
	}
	return &usageError{msg: fmt.Sprintf("no help for %q", strings.Join(topic, " ")), usage: usageMain}
}

// flagSet returns a FlagSet that reports errors to us instead of printing
// them, with the global flags already registered.
func (a *app) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a.g.register(fs)
	return fs
}

func flagError(err error, usage string) error {
	if errors.Is(err, flag.ErrHelp) {
		return &helpRequest{usage: usage}
	}
	return &usageError{msg: err.Error(), usage: usage}
}

// parseArgs parses flags wherever they appear among args and returns the
// positional arguments in order. "--" ends flag parsing; so does the
// stopAfter-th positional argument when stopAfter > 0. Everything after
// that point is returned verbatim (a terminating "--" itself is dropped).
// parseNoArgs parses the flags of a command that takes no positional
// arguments, refusing any with the command's usage.
func parseNoArgs(fs *flag.FlagSet, args []string, usage string) error {
	pos, err := parseArgs(fs, args, 0)
	if err != nil {
		return flagError(err, usage)
	}
	if len(pos) > 0 {
		return &usageError{msg: fmt.Sprintf("unexpected argument %q", pos[0]), usage: usage}
	}
	return nil
}

// A lone "-" is positional.
func parseArgs(fs *flag.FlagSet, args []string, stopAfter int) ([]string, error) {
	var pos []string
	for i := 0; i < len(args); i++ {
		if stopAfter > 0 && len(pos) >= stopAfter {
			return append(pos, args[i:]...), nil
		}
		arg := args[i]
		if arg == "--" {
			return append(pos, args[i+1:]...), nil
		}
		if len(arg) < 2 || arg[0] != '-' {
			pos = append(pos, arg)
			continue
		}
		chunk := args[i : i+1]
		if takesValue(fs, arg) && i+1 < len(args) {
			chunk = args[i : i+2]
			i++
		}
		if err := fs.Parse(chunk); err != nil {
			return nil, err
		}
	}
	return pos, nil
}

// takesValue reports whether arg names a known non-boolean flag given
// without "=value", so the next argument is its value.
func takesValue(fs *flag.FlagSet, arg string) bool {
	name := strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-")
	if strings.Contains(name, "=") {
		return false
	}
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// kvFlag collects repeated K=V flags (--env, --metadata). The zero value is
// ready to use.
// listFlag collects a repeatable flag's values.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

type kvFlag struct{ m map[string]string }

func (k *kvFlag) String() string {
	if k == nil || len(k.m) == 0 {
		return ""
	}
	parts := make([]string, 0, len(k.m))
	for key, v := range k.m {
		parts = append(parts, key+"="+v)
	}
	return strings.Join(parts, ",")
}

func (k *kvFlag) Set(s string) error {
	key, val, ok := strings.Cut(s, "=")
	if !ok || key == "" {
		return fmt.Errorf("want K=V, got %q", s)
	}
	if k.m == nil {
		k.m = map[string]string{}
	}
	k.m[key] = val
	return nil
}

// wire returns the pairs as the API's string maps have them (values are
// nullable there); nil when there are none.
func (k *kvFlag) wire() map[string]*string {
	if len(k.m) == 0 {
		return nil
	}
	out := make(map[string]*string, len(k.m))
	for key, v := range k.m {
		out[key] = &v
	}
	return out
}
