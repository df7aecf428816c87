package build

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/envd/process"
	"github.com/cellfork/cellfork/internal/envd/process/processconnect"
)

// agent talks to the agent of one build or warm-up sandbox.
type agent struct {
	hc   *http.Client
	base string // http://sandbox:49983
	proc processconnect.ProcessClient
}

func newAgent(tr http.RoundTripper) *agent {
	hc := &http.Client{Transport: tr}
	base := fmt.Sprintf("http://sandbox:%d", envd.Port)
	return &agent{hc: hc, base: base, proc: processconnect.NewProcessClient(hc, base, connect.WithProtoJSON())}
}

// init sets the sandbox's defaults (POST /init, as the daemon does at a
// hand-off).
func (a *agent) init(ctx context.Context, c Context, maxUpload int64) error {
	body, _ := json.Marshal(envd.InitRequest{EnvVars: c.Env, DefaultUser: c.User, DefaultWorkdir: c.Workdir, MaxUploadBytes: maxUpload})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+"/init", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("posting /init: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("agent refused /init: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// upload writes r to path in the sandbox, as root.
func (a *agent) upload(ctx context.Context, path string, r io.Reader) error {
	u := a.base + "/files?" + url.Values{"path": {path}, "username": {"root"}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("uploading to the build sandbox: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("uploading to the build sandbox: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// waitReady waits for the agent's default code context (GET /ready on the
// code interpreter's port).
func (a *agent) waitReady(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://sandbox:%d/ready", envd.CodeInterpreterPort), nil)
	if err != nil {
		return err
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// command is one process to run in a build sandbox.
type command struct {
	shell string // /bin/bash or /bin/sh
	cmd   string
	c     Context
	// out gets each line of output (stderr tagged); nil discards it.
	out func(line string, stderr bool)
}

// userHeader selects the user a request runs as (envd's Basic auth).
func userHeader(h http.Header, user string) {
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
}

func (a *agent) startRequest(c command) *connect.Request[process.StartRequest] {
	envs := maps.Clone(c.c.Env)
	if envs == nil {
		envs = map[string]string{}
	}
	// Whatever PATH a step set, the standard directories stay reachable.
	if p, ok := envs["PATH"]; ok {
		envs["PATH"] = p + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	args := []string{"-c", c.cmd}
	if c.shell == "/bin/bash" {
		args = []string{"-l", "-c", c.cmd}
	}
	cfg := &process.ProcessConfig{Cmd: c.shell, Args: args, Envs: envs}
	if c.c.Workdir != "" {
		cfg.Cwd = &c.c.Workdir
	}
	req := connect.NewRequest(&process.StartRequest{Process: cfg})
	userHeader(req.Header(), c.c.User)
	return req
}

// errExit is a command that ran and failed: its status ("exit status 1").
type errExit struct{ status string }

func (e *errExit) Error() string { return e.status }

// run runs c to its end. A command that fails returns errExit; one that
// could not run returns the agent's error (as E2B words them: "command
// failed: unauthenticated: invalid username: 'x'").
func (a *agent) run(ctx context.Context, c command) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := a.proc.Start(ctx, a.startRequest(c))
	if err != nil {
		return fmt.Errorf("error starting process: %w", err)
	}
	defer stream.Close()
	lw := newLineWriter(c.out)
	defer lw.flush()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		switch {
		case ev.GetData() != nil:
			lw.write(ev.GetData().GetStdout(), false)
			lw.write(ev.GetData().GetStderr(), true)
		case ev.GetEnd() != nil:
			lw.flush()
			end := ev.GetEnd()
			if end.GetExitCode() != 0 || !end.GetExited() {
				status := end.GetStatus()
				if status == "" {
					status = fmt.Sprintf("exit status %d", end.GetExitCode())
				}
				return &errExit{status}
			}
			return nil
		}
	}
	if err := stream.Err(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("command failed: %w", err)
	}
	return errors.New("command failed: the agent ended the stream without an exit status")
}

// started is a process left running (the start command).
type started struct {
	done chan struct{} // closed when it has ended (or the stream broke)
	mu   sync.Mutex
	err  error // guarded by mu: why it ended (nil: exit 0)
	stop context.CancelFunc
}

func (s *started) result() (bool, error) {
	select {
	case <-s.done:
		s.mu.Lock()
		defer s.mu.Unlock()
		return true, s.err
	default:
		return false, nil
	}
}

// start starts c and returns once it runs; its output keeps going to
// c.out until detach.
func (a *agent) start(ctx context.Context, c command) (*started, error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	req := a.startRequest(c)
	tag := "start-cmd"
	req.Msg.Tag = &tag
	stream, err := a.proc.Start(sctx, req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("error starting process: %w", err)
	}
	s := &started{done: make(chan struct{}), stop: cancel}
	if !stream.Receive() || stream.Msg().GetEvent().GetStart() == nil {
		err := stream.Err()
		stream.Close()
		cancel()
		if err == nil {
			err = errors.New("no start event")
		}
		return nil, fmt.Errorf("command failed: %w", err)
	}
	go func() {
		defer close(s.done)
		defer stream.Close()
		lw := newLineWriter(c.out)
		defer lw.flush()
		for stream.Receive() {
			ev := stream.Msg().GetEvent()
			switch {
			case ev.GetData() != nil:
				lw.write(ev.GetData().GetStdout(), false)
				lw.write(ev.GetData().GetStderr(), true)
			case ev.GetEnd() != nil:
				lw.flush()
				if end := ev.GetEnd(); end.GetExitCode() != 0 || !end.GetExited() {
					s.mu.Lock()
					s.err = &errExit{end.GetStatus()}
					s.mu.Unlock()
				}
				return
			}
		}
		if err := stream.Err(); err != nil && sctx.Err() == nil {
			s.mu.Lock()
			s.err = fmt.Errorf("command failed: %w", err)
			s.mu.Unlock()
		}
	}()
	return s, nil
}

// detach stops following the process; it keeps running in the sandbox.
func (s *started) detach() {
	s.stop()
	<-s.done
}

// lineWriter splits output into lines for the build log, bounding each.
type lineWriter struct {
	out     func(string, bool)
	buf     [2]bytes.Buffer // stdout, stderr
	maxLine int
}

func newLineWriter(out func(string, bool)) *lineWriter {
	return &lineWriter{out: out, maxLine: 4096}
}

func (w *lineWriter) write(b []byte, stderr bool) {
	if w.out == nil || len(b) == 0 {
		return
	}
	i := 0
	if stderr {
		i = 1
	}
	w.buf[i].Write(b)
	for {
		line, err := w.buf[i].ReadString('\n')
		if err != nil { // no newline yet: keep the rest
			rest := line
			w.buf[i].Reset()
			if len(rest) > w.maxLine {
				w.out(rest[:w.maxLine], stderr)
				rest = ""
			}
			w.buf[i].WriteString(rest)
			return
		}
		w.out(strings.TrimRight(line, "\r\n"), stderr)
	}
}

func (w *lineWriter) flush() {
	if w.out == nil {
		return
	}
	for i := range w.buf {
		if w.buf[i].Len() > 0 {
			w.out(strings.TrimRight(w.buf[i].String(), "\r\n"), i == 1)
			w.buf[i].Reset()
		}
	}
}
