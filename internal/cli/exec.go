package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/envd/process"
	"github.com/cellfork/cellfork/internal/envd/process/processconnect"
)

// killTimeout bounds the SendSignal sent after an interrupted exec.
const killTimeout = 5 * time.Second

// execOptions is a parsed `cellfork exec` command line.
type execOptions struct {
	user    string
	cwd     string
	env     kvFlag
	timeout int // seconds, 0 = none
	id      string
	cmd     []string
}

// parseExec parses `exec [flags] ID [--] CMD [ARGS...]`. Flags may follow ID
// only when a "--" ends them: `exec ID --user root -- whoami`.
func (a *app) parseExec(args []string) (*execOptions, error) {
	o := &execOptions{}
	fs := a.flagSet("exec")
	fs.StringVar(&o.user, "user", "", "")
	fs.StringVar(&o.cwd, "cwd", "", "")
	fs.Var(&o.env, "env", "")
	fs.IntVar(&o.timeout, "timeout", 60, "")
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return nil, flagError(err, usageExec)
	}
	if len(pos) == 0 {
		return nil, &usageError{msg: "missing sandbox id", usage: usageExec}
	}
	o.id, pos = pos[0], pos[1:]
	if k := slices.Index(pos, "--"); k >= 0 && (k == 0 || strings.HasPrefix(pos[0], "-")) {
		extra, err := parseArgs(fs, pos[:k], 0)
		if err != nil {
			return nil, flagError(err, usageExec)
		}
		if len(extra) > 0 {
			return nil, &usageError{msg: fmt.Sprintf("unexpected argument %q before --", extra[0]), usage: usageExec}
		}
		pos = pos[k+1:]
	}
	if len(pos) == 0 {
		return nil, &usageError{msg: "missing command", usage: usageExec}
	}
	if o.timeout < 0 {
		return nil, &usageError{msg: "--timeout must not be negative", usage: usageExec}
	}
	o.cmd = pos
	return o, nil
}

func (a *app) exec(ctx context.Context, args []string) error {
	o, err := a.parseExec(args)
	if err != nil {
		return err
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	token, err := c.accessToken(ctx, o.id)
	if err != nil {
		return err
	}
	capture := &captureTransport{base: a.roundTripper()}
	pc := processconnect.NewProcessClient(&http.Client{Transport: capture}, c.Base, connect.WithProtoJSON())
	req := connect.NewRequest(startRequest(o))
	setEnvdHeaders(req.Header(), o.id, token, o.user)
	req.Header().Set("Keepalive-Ping-Interval", "50")

	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if o.timeout > 0 {
		runCtx, cancel = context.WithTimeout(ctx, time.Duration(o.timeout)*time.Second)
	}
	defer cancel()
	stream, err := pc.Start(runCtx, req)
	if err != nil {
		return rpcError(err, capture)
	}
	defer stream.Close()
	code, pid, err := a.streamProcess(stream)
	if err == nil {
		if code != 0 {
			return &exitError{code: code}
		}
		return nil
	}
	// The deadline travels as connect-timeout-ms, so the server may end the
	// stream with deadline_exceeded just before our own context expires.
	timedOut := ctx.Err() == nil && (errors.Is(runCtx.Err(), context.DeadlineExceeded) ||
		(o.timeout > 0 && connect.CodeOf(err) == connect.CodeDeadlineExceeded))
	if pid != 0 && (timedOut || ctx.Err() != nil) {
		killRemote(context.WithoutCancel(ctx), pc, o, token, pid)
	}
	if timedOut {
		return fmt.Errorf("command timed out after %ds", o.timeout)
	}
	return rpcError(err, capture)
}

// startRequest is what the E2B SDK's commands.run sends (spec §4.3).
func startRequest(o *execOptions) *process.StartRequest {
	stdin := false
	cfg := &process.ProcessConfig{
		Cmd:  "/bin/bash",
		Args: []string{"-l", "-c", shellJoin(o.cmd)},
		Envs: o.env.m,
	}
	if o.cwd != "" {
		cfg.Cwd = &o.cwd
	}
	return &process.StartRequest{Process: cfg, Stdin: &stdin}
}

// setEnvdHeaders sets the data-plane routing and auth headers for envd.
func setEnvdHeaders(h http.Header, id, token, user string) {
	h.Set("E2b-Sandbox-Id", id)
	h.Set("E2b-Sandbox-Port", strconv.Itoa(envd.Port))
	if token != "" {
		h.Set("X-Access-Token", token)
	}
	if user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

// killRemote sends SIGKILL to the sandbox process of an exec that was
// interrupted or timed out, on its own short deadline.
func killRemote(ctx context.Context, pc processconnect.ProcessClient, o *execOptions, token string, pid uint32) {
	ctx, cancel := context.WithTimeout(ctx, killTimeout)
	defer cancel()
	req := connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
		Signal:  process.Signal_SIGNAL_SIGKILL,
	})
	setEnvdHeaders(req.Header(), o.id, token, o.user)
	_, _ = pc.SendSignal(ctx, req) // best effort: the process may be gone already
}

// rpcError turns a Connect error into what the user sees: the daemon's own
// message and request id when the call failed at the HTTP level.
func rpcError(err error, capture *captureTransport) error {
	requestID, httpErr := capture.last()
	if httpErr != nil {
		return httpErr
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	msg := ce.Message()
	if msg == "" {
		msg = ce.Code().String()
	}
	if id := ce.Meta().Get("X-Request-Id"); id != "" {
		requestID = id
	}
	return &apiError{Message: msg, RequestID: requestID}
}

// eventSource is the receiving side of a process.Process/Start stream.
type eventSource interface {
	Receive() bool
	Msg() *process.StartResponse
	Err() error
}

// execEvent is one line of `cellfork exec --json`.
type execEvent struct {
	Type     string  `json:"type"` // start, stdout, stderr, pty, end
	PID      uint32  `json:"pid,omitempty"`
	Text     *string `json:"text,omitempty"`
	ExitCode *int    `json:"exitCode,omitempty"`
	Exited   *bool   `json:"exited,omitempty"`
	Status   *string `json:"status,omitempty"`
	Error    *string `json:"error,omitempty"`
}

// streamProcess copies a process's output to ours (or renders it as NDJSON
// with --json) until its end event, and returns its exit code and pid.
func (a *app) streamProcess(src eventSource) (code int, pid uint32, err error) {
	enc := json.NewEncoder(a.stdout)
	enc.SetEscapeHTML(false)
	var end *process.ProcessEvent_EndEvent
	for end == nil && src.Receive() {
		ev := src.Msg().GetEvent()
		var out *execEvent
		switch {
		case ev.GetStart() != nil:
			pid = ev.GetStart().GetPid()
			out = &execEvent{Type: "start", PID: pid}
		case ev.GetData() != nil:
			out, err = a.writeData(ev.GetData())
		case ev.GetEnd() != nil:
			end = ev.GetEnd()
			out = endEvent(end)
		}
		if err != nil {
			return 0, pid, err
		}
		if a.g.json && out != nil {
			if err := enc.Encode(out); err != nil {
				return 0, pid, err
			}
		}
	}
	if err := src.Err(); err != nil {
		return 0, pid, err
	}
	if end == nil {
		return 0, pid, errors.New("command ended without an end event")
	}
	if e := end.GetError(); e != "" && !a.g.json {
		fmt.Fprintf(a.stderr, "cellfork: %s\n", e)
	}
	return exitCode(end), pid, nil
}

// writeData writes an output chunk to our stdout/stderr, or with --json
// returns the event to print.
func (a *app) writeData(d *process.ProcessEvent_DataEvent) (*execEvent, error) {
	kind, data := "stdout", d.GetStdout()
	switch {
	case d.GetStderr() != nil:
		kind, data = "stderr", d.GetStderr()
	case d.GetPty() != nil:
		kind, data = "pty", d.GetPty()
	}
	if a.g.json {
		text := string(data)
		return &execEvent{Type: kind, Text: &text}, nil
	}
	w := a.stdout
	if kind == "stderr" {
		w = a.stderr
	}
	_, err := w.Write(data)
	return nil, err
}

func endEvent(end *process.ProcessEvent_EndEvent) *execEvent {
	code, exited, status := exitCode(end), end.GetExited(), end.GetStatus()
	ev := &execEvent{Type: "end", ExitCode: &code, Exited: &exited, Status: &status}
	if end.Error != nil {
		ev.Error = end.Error
	}
	return ev
}

// exitCode maps an end event to a shell-style exit code: the process's own
// code, 128+N when killed by signal N, else 1.
func exitCode(end *process.ProcessEvent_EndEvent) int {
	if end.GetExited() && end.GetExitCode() >= 0 {
		return int(end.GetExitCode())
	}
	status := end.GetStatus()
	if n, ok := strings.CutPrefix(status, "exit status "); ok {
		if v, err := strconv.Atoi(n); err == nil && v >= 0 {
			return v
		}
	}
	if name, ok := strings.CutPrefix(status, "signal: "); ok {
		if n := signalNumber(strings.TrimSuffix(name, " (core dumped)")); n > 0 {
			return 128 + n
		}
	}
	if c := end.GetExitCode(); c > 0 {
		return int(c)
	}
	return 1
}

// signalNumber maps a Go signal description ("killed", "terminated") to its
// number, 0 if unknown.
func signalNumber(name string) int {
	for n := 1; n < 65; n++ {
		if syscall.Signal(n).String() == name {
			return n
		}
	}
	return 0
}

// shellJoin quotes each argument for bash and joins them with spaces, so
// bash -c runs exactly this argv with no expansion.
func shellJoin(args []string) string {
	quoted := make([]string, len(args))
	for i, s := range args {
		quoted[i] = shellQuote(s)
	}
	return strings.Join(quoted, " ")
}

// shellQuote returns s as one bash word: unchanged if it has only
// characters that are never special, else single-quoted.
func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !isShellSafe(r) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// isShellSafe reports whether r never needs quoting in any word position.
// '=' and '%' are excluded: "A=b" as a first word is an assignment, "%1" a
// job; '~' expands at the start of a word.
func isShellSafe(r rune) bool {
	switch {
	case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9':
		return true
	}
	return strings.ContainsRune("_@,./:+-", r)
}
