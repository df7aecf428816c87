package envd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/cellfork/cellfork/internal/envd/process"
)

// result is what one process stream delivered.
type result struct {
	pid                 uint32
	stdout, stderr, pty bytes.Buffer
	keepalives          int
	end                 *process.ProcessEvent_EndEvent
	order               []string // event kinds in arrival order
}

// eventStream is the part of StartResponse/ConnectResponse streams used here.
type eventStream interface {
	Receive() bool
	Err() error
}

func collect(t *testing.T, s eventStream, next func() *process.ProcessEvent) (*result, error) {
	t.Helper()
	r := &result{}
	for s.Receive() {
		ev := next()
		switch e := ev.GetEvent().(type) {
		case *process.ProcessEvent_Start:
			r.pid = e.Start.GetPid()
			r.order = append(r.order, "start")
		case *process.ProcessEvent_Data:
			r.stdout.Write(e.Data.GetStdout())
			r.stderr.Write(e.Data.GetStderr())
			r.pty.Write(e.Data.GetPty())
			r.order = append(r.order, "data")
		case *process.ProcessEvent_Keepalive:
			r.keepalives++
			r.order = append(r.order, "keepalive")
		case *process.ProcessEvent_End:
			r.end = e.End
			r.order = append(r.order, "end")
		}
	}
	return r, s.Err()
}

func (e *env) start(ctx context.Context, req *process.StartRequest, hdr func(h map[string][]string)) (*result, error) {
	e.t.Helper()
	creq := connect.NewRequest(req)
	if hdr != nil {
		hdr(creq.Header())
	}
	s, err := e.proc.Start(ctx, creq)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return collect(e.t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() })
}

func bash(script string) *process.StartRequest {
	return &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}},
		Stdin:   proto.Bool(false),
	}
}

func TestStartStreamsOutputAndExitCode(t *testing.T) {
	e := newEnv(t)
	r, err := e.start(ctxTimeout(t, 20*time.Second), bash("echo out; echo err >&2; exit 3"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.order[0] != "start" || r.order[len(r.order)-1] != "end" || r.pid == 0 {
		t.Fatalf("event order %v, pid %d", r.order, r.pid)
	}
	if r.stdout.String() != "out\n" || r.stderr.String() != "err\n" {
		t.Fatalf("stdout %q stderr %q", r.stdout.String(), r.stderr.String())
	}
	if r.end.GetExitCode() != 3 || !r.end.GetExited() || r.end.GetStatus() != "exit status 3" || r.end.GetError() != "exit status 3" {
		t.Fatalf("end = %v", r.end)
	}
}

func TestStartSuccessHasNoError(t *testing.T) {
	e := newEnv(t)
	r, err := e.start(ctxTimeout(t, 20*time.Second), bash("true"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.end.GetExitCode() != 0 || r.end.Error != nil || r.end.GetStatus() != "exit status 0" {
		t.Fatalf("end = %v", r.end)
	}
}

func TestStartEnvCwdAndUser(t *testing.T) {
	e := newEnv(t)
	req := bash(`echo "$PWD|$HOME|$USER|$LOGNAME|$CELLFORK_GLOBAL|$REQ|$(id -u)"`)
	req.Process.Envs = map[string]string{"REQ": "r", "CELLFORK_GLOBAL": "overridden"}
	r, err := e.start(ctxTimeout(t, 20*time.Second), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	// HOME: the sandbox-wide value (newEnv sets it) wins over the account's.
	if want := e.dir + "|" + e.dir + "|root|root|overridden|r|0\n"; r.stdout.String() != want {
		t.Fatalf("got %q, want %q", r.stdout.String(), want)
	}

	// Another user, selected like the SDK does, with setuid and its home.
	req = bash(`echo "$(id -u):$(id -g)|$HOME|$USER|$PWD"`)
	req.Process.Cwd = proto.String("/")
	r, err = e.start(ctxTimeout(t, 20*time.Second), req, func(h map[string][]string) { asUser(h, "nobody") })
	if err != nil {
		t.Fatal(err)
	}
	// HOME is newEnv's sandbox-wide value (the account's own home is what
	// the integration tests check: /home/user in a real sandbox).
	if want := "65534:65534|" + e.dir + "|nobody|/\n"; r.stdout.String() != want {
		t.Fatalf("got %q, want %q", r.stdout.String(), want)
	}
}

func TestStartRejectsBadRequests(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	_, err := e.start(ctx, bash("true"), func(h map[string][]string) { asUser(h, "no-such-user-xyz") })
	wantCode(t, err, connect.CodeUnauthenticated)
	if !strings.Contains(err.Error(), "no-such-user-xyz") {
		t.Fatalf("message %q does not name the user", err)
	}

	req := bash("true")
	req.Process.Cwd = proto.String("/does/not/exist")
	_, err = e.start(ctx, req, nil)
	wantCode(t, err, connect.CodeInvalidArgument)

	req = bash("true")
	req.Process.Envs = map[string]string{"A=B": "x"}
	_, err = e.start(ctx, req, nil)
	wantCode(t, err, connect.CodeInvalidArgument)

	_, err = e.start(ctx, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "no-such-binary-xyz"}}, nil)
	wantCode(t, err, connect.CodeInvalidArgument)
}

func TestStartLooksUpCommandInPath(t *testing.T) {
	e := newEnv(t)
	r, err := e.start(ctxTimeout(t, 20*time.Second), &process.StartRequest{Process: &process.ProcessConfig{Cmd: "echo", Args: []string{"a", "b"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.stdout.String() != "a b\n" {
		t.Fatalf("got %q", r.stdout.String())
	}
}

func TestStdinSendAndClose(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	req := bash("cat; echo done")
	req.Stdin = proto.Bool(true)
	s, err := e.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
		Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("hello\n")}},
	})); err != nil {
		t.Fatal(err)
	}
	// StreamInput: start, data, keepalive.
	in := e.proc.StreamInput(ctx)
	for _, m := range []*process.StreamInputRequest{
		{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: sel}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("streamed\n")}}}}},
		{Event: &process.StreamInputRequest_Keepalive{Keepalive: &process.StreamInputRequest_KeepAlive{}}},
	} {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() })
	if err != nil {
		t.Fatal(err)
	}
	if r.stdout.String() != "hello\nstreamed\ndone\n" || r.end.GetExitCode() != 0 {
		t.Fatalf("stdout %q end %v", r.stdout.String(), r.end)
	}
}

func TestStdinDisabled(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	// cat reads /dev/null and exits at once.
	r, err := e.start(ctx, bash("cat; echo ok"), nil)
	if err != nil || r.stdout.String() != "ok\n" {
		t.Fatalf("err %v stdout %q", err, r.stdout.String())
	}
	s, err := e.proc.Start(ctx, connect.NewRequest(bash("sleep 5")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Receive()
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: s.Msg().GetEvent().GetStart().GetPid()}}
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
		Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("x")}},
	}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
}

// TestSendSignalKillAnswersWhenGone: once SendSignal(SIGKILL) has answered,
// the process no longer exists (not even as a zombie), every time.
func TestSendSignalKillAnswersWhenGone(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 60*time.Second)
	for i := range 30 {
		s, err := e.proc.Start(ctx, connect.NewRequest(bash("sleep 30")))
		if err != nil {
			t.Fatal(err)
		}
		s.Receive()
		pid := s.Msg().GetEvent().GetStart().GetPid()
		sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
		if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(int(pid), 0); !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("kill %d: process %d still there after SIGKILL answered (%v)", i, pid, err)
		}
		s.Close()
	}
}

func TestSendSignalKills(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	s, err := e.proc.Start(ctx, connect.NewRequest(bash("sleep 30; echo never")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Receive()
	pid := s.Msg().GetEvent().GetStart().GetPid()
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() })
	if err != nil {
		t.Fatal(err)
	}
	if r.end.GetExitCode() != -1 || r.end.GetExited() || r.end.GetStatus() != "signal: killed" {
		t.Fatalf("end = %v", r.end)
	}
	poll(t, "the process to leave the list", func() bool { return !e.listed(ctx, pid) })
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

func (e *env) listed(ctx context.Context, pid uint32) bool {
	e.t.Helper()
	res, err := e.proc.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range res.Msg.GetProcesses() {
		if p.GetPid() == pid {
			return true
		}
	}
	return false
}

func TestBackgroundProcessSurvivesDisconnectAndReconnects(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 30*time.Second)
	startCtx, cancelStart := context.WithCancel(ctx)
	req := bash("for i in $(seq 1 300); do echo line$i; sleep 0.05; done")
	req.Tag = proto.String("bg")
	s, err := e.proc.Start(startCtx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	s.Receive()
	pid := s.Msg().GetEvent().GetStart().GetPid()
	s.Receive() // some output
	cancelStart()
	s.Close()

	time.Sleep(200 * time.Millisecond)
	res, err := e.proc.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var info *process.ProcessInfo
	for _, p := range res.Msg.GetProcesses() {
		if p.GetPid() == pid {
			info = p
		}
	}
	if info == nil || info.GetTag() != "bg" || info.GetConfig().GetCmd() != "/bin/bash" || len(info.GetConfig().GetArgs()) != 3 {
		t.Fatalf("list = %v", res.Msg)
	}

	c, err := e.proc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "bg"}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.Receive() || c.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("first Connect message = %v (%v)", c.Msg(), c.Err())
	}
	if !c.Receive() || !strings.HasPrefix(string(c.Msg().GetEvent().GetData().GetStdout()), "line") {
		t.Fatalf("second Connect message = %v (%v)", c.Msg(), c.Err())
	}
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, c, func() *process.ProcessEvent { return c.Msg().GetEvent() })
	if err != nil || r.end == nil || r.end.GetStatus() != "signal: terminated" {
		t.Fatalf("err %v end %v", err, r.end)
	}

	poll(t, "the process to leave the list", func() bool { return !e.listed(ctx, pid) })
	c2, err := e.proc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: sel}))
	if err == nil {
		c2.Receive()
		err = c2.Err()
	}
	wantCode(t, err, connect.CodeNotFound)
}

func TestDeadlineKillsProcess(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	begin := time.Now()
	r, err := e.start(ctx, bash("echo started; sleep 30"), nil)
	wantCode(t, err, connect.CodeDeadlineExceeded)
	if time.Since(begin) > 5*time.Second {
		t.Fatalf("deadline took %v", time.Since(begin))
	}
	if r != nil && r.end != nil {
		t.Fatalf("got an end event %v on timeout", r.end)
	}
	poll(t, "no processes left", func() bool {
		res, err := e.proc.List(context.Background(), connect.NewRequest(&process.ListRequest{}))
		return err == nil && len(res.Msg.GetProcesses()) == 0
	})
}

func TestKeepalive(t *testing.T) {
	e := newEnv(t)
	r, err := e.start(ctxTimeout(t, 20*time.Second), bash("sleep 2.5; echo x"), func(h map[string][]string) {
		h["Keepalive-Ping-Interval"] = []string{"1"}
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.keepalives < 1 || r.order[0] != "start" {
		t.Fatalf("order %v", r.order)
	}
}

func TestGrandchildHoldingPipesDoesNotBlockEnd(t *testing.T) {
	e := newEnv(t)
	begin := time.Now()
	r, err := e.start(ctxTimeout(t, 20*time.Second), bash("sleep 30 & echo $!"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var orphan int
	if _, err := fmt.Sscan(r.stdout.String(), &orphan); err != nil || orphan <= 0 {
		t.Fatalf("stdout %q", r.stdout.String())
	}
	defer syscall.Kill(orphan, syscall.SIGKILL)
	if time.Since(begin) > 5*time.Second || r.end == nil {
		t.Fatalf("took %v, end %v", time.Since(begin), r.end)
	}
}

func TestLargeOutputIsComplete(t *testing.T) {
	e := newEnv(t)
	r, err := e.start(ctxTimeout(t, 30*time.Second), bash("head -c 3000000 /dev/zero | tr '\\0' a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.stdout.Len() != 3000000 {
		t.Fatalf("got %d bytes", r.stdout.Len())
	}
}

func TestPTY(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	req := &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/sh", Envs: map[string]string{"TERM": "xterm-256color", "PS1": "$ "}},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}},
	}
	s, err := e.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Receive()
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: s.Msg().GetEvent().GetStart().GetPid()}}
	send := func(in string) {
		t.Helper()
		if _, err := e.proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
			Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte(in)}},
		})); err != nil {
			t.Fatal(err)
		}
	}
	send("tty; stty size\n")
	var out bytes.Buffer
	readUntil := func(want string) {
		t.Helper()
		for !strings.Contains(out.String(), want) {
			if !s.Receive() {
				t.Fatalf("stream ended before %q: %q (%v)", want, out.String(), s.Err())
			}
			out.Write(s.Msg().GetEvent().GetData().GetPty())
		}
	}
	readUntil("24 80")
	if !strings.Contains(out.String(), "/dev/pts/") {
		t.Fatalf("no tty in %q", out.String())
	}
	if _, err := e.proc.Update(ctx, connect.NewRequest(&process.UpdateRequest{
		Process: sel, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 100, Rows: 30}},
	})); err != nil {
		t.Fatal(err)
	}
	_, err = e.proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	send("stty size; exit 7\n")
	readUntil("30 100")
	r, err := collect(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() })
	if err != nil || r.end.GetExitCode() != 7 {
		t.Fatalf("err %v end %v", err, r.end)
	}
}

func TestUpdateWithoutPTY(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	s, err := e.proc.Start(ctx, connect.NewRequest(bash("sleep 5")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Receive()
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: s.Msg().GetEvent().GetStart().GetPid()}}
	_, err = e.proc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: sel, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 1, Rows: 1}}}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	_, err = e.proc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 1 << 30}}}))
	wantCode(t, err, connect.CodeNotFound)
	_, _ = e.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
}

func TestManyConcurrentProcesses(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 30*time.Second)
	errs := make(chan error, 10)
	for i := range 10 {
		go func() {
			r, err := e.start(ctx, bash(fmt.Sprintf("echo %d", i)), nil)
			if err == nil && r.stdout.String() != fmt.Sprintf("%d\n", i) {
				err = fmt.Errorf("process %d printed %q", i, r.stdout.String())
			}
			errs <- err
		}()
	}
	for range 10 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
