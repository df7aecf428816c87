package envd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/agent"
	"github.com/cellfork/cellfork/internal/envd/process"
)

// defaultKeepalive is upstream envd's keepalive interval when the client
// sends no Keepalive-Ping-Interval header.
const defaultKeepalive = 90 * time.Second

// processService implements process.Process. Safe for concurrent use.
type processService struct {
	settings *agent.Settings
	zygotes  *zygotes

	mu    sync.Mutex
	procs map[uint32]*proc
}

// newProcessService returns the service, with a zygote for the default
// user on its way.
func newProcessService(s *agent.Settings) *processService {
	ps := &processService{settings: s, zygotes: newZygotes(), procs: map[uint32]*proc{}}
	go ps.warmDefault()
	return ps
}

// warmDefault readies a zygote for the default user with the current
// sandbox-wide settings (at start, and after /init changed them).
func (s *processService) warmDefault() {
	acc, err := lookupAccount(s.settings, "")
	if err != nil {
		return
	}
	groups := supplementaryGroups(acc)
	base, err := buildEnv(acc, s.settings.Envs(), nil)
	if err == nil {
		s.zygotes.refill(acc, groups, base, zygoteKey(acc, groups, base))
	}
}

// keepaliveInterval reads the Keepalive-Ping-Interval header (seconds).
func keepaliveInterval(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return defaultKeepalive
	}
	return time.Duration(n) * time.Second
}

// requestAccount resolves the user of an RPC from its Authorization header.
func requestAccount(s *agent.Settings, h http.Header) (agent.Account, error) {
	name, err := usernameFromHeader(h)
	if err != nil {
		return agent.Account{}, err
	}
	return lookupAccount(s, name)
}

// prepare validates a StartRequest into a procSpec.
func (s *processService) prepare(h http.Header, req *process.StartRequest) (procSpec, error) {
	acc, err := requestAccount(s.settings, h)
	if err != nil {
		return procSpec{}, err
	}
	cfg := req.GetProcess()
	if cfg.GetCmd() == "" {
		return procSpec{}, invalidf("process.cmd is required")
	}
	dir, err := resolvePath(cfg.GetCwd(), acc, s.settings.Workdir())
	if err != nil {
		return procSpec{}, err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return procSpec{}, invalidf("cwd '%s' does not exist or is not a directory", dir)
	}
	global := s.settings.Envs()
	env, err := buildEnv(acc, global, agent.WithTraceEnv(h, cfg.GetEnvs()))
	if err != nil {
		return procSpec{}, err
	}
	base, _ := buildEnv(acc, global, nil)
	path, err := lookPath(cfg.GetCmd(), envValue(env, "PATH"))
	if err != nil {
		return procSpec{}, err
	}
	return procSpec{acc: acc, path: path, dir: dir, env: env, base: base, req: req, groups: supplementaryGroups(acc)}, nil
}

// Start runs a process and streams its events. The process outlives the
// stream unless the request deadline (connect-timeout-ms) passes, which
// kills it and fails the stream with deadline_exceeded.
func (s *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	spec, err := s.prepare(req.Header(), req.Msg)
	if err != nil {
		return connectError("Start", err)
	}
	procCtx, cancel := context.Background(), context.CancelFunc(func() {})
	if dl, ok := ctx.Deadline(); ok {
		procCtx, cancel = context.WithDeadline(context.Background(), dl)
	}
	out := newOutput()
	sub := out.subscribe()
	defer out.unsubscribe(sub)
	p, err := s.spawn(procCtx, cancel, spec, out)
	if err != nil {
		cancel()
		return connectError("Start", err)
	}
	s.track(p)
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	return streamProcess(ctx, p, sub, keepaliveInterval(req.Header()), send, true)
}

// spawn starts the process: in a zygote if one fits, else on its own.
func (s *processService) spawn(ctx context.Context, cancel context.CancelFunc, spec procSpec, out *output) (*proc, error) {
	if cmd, ok := loginCommand(spec); ok {
		if z := s.zygotes.claim(spec, cmd); z != nil {
			return z.proc(ctx, cancel, spec, out), nil
		}
	}
	return startProc(ctx, cancel, spec, out)
}

// Connect reattaches to the output of a running process.
func (s *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return connectError("Connect", err)
	}
	sub := p.out.subscribe()
	defer p.out.unsubscribe(sub)
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	return streamProcess(ctx, p, sub, keepaliveInterval(req.Header()), send, false)
}

// track registers p until its end event has been published.
func (s *processService) track(p *proc) {
	s.mu.Lock()
	s.procs[p.pid] = p
	s.mu.Unlock()
	go func() {
		<-p.out.done
		s.mu.Lock()
		if s.procs[p.pid] == p {
			delete(s.procs, p.pid)
		}
		s.mu.Unlock()
	}()
}

// streamProcess sends start{pid}, the data events with keepalives in
// between, and finally end. With isOwner (the Start stream) a process killed
// by the deadline fails the stream with deadline_exceeded instead.
func streamProcess(ctx context.Context, p *proc, sub *subscriber, keepalive time.Duration, send func(*process.ProcessEvent) error, isOwner bool) error {
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	timer := time.NewTimer(keepalive)
	defer timer.Stop()
	sendData := func(d *process.ProcessEvent_DataEvent) error {
		timer.Reset(keepalive)
		return send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}})
	}
	for {
		select {
		case d := <-sub.events:
			if err := sendData(d); err != nil {
				return err
			}
		case <-p.out.done:
			// All data was queued before done closed; flush it, then end.
			for len(sub.events) > 0 {
				if err := sendData(<-sub.events); err != nil {
					return err
				}
			}
			if isOwner && p.timedOut.Load() {
				return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("command timed out and was killed"))
			}
			return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: p.out.endEvent()}})
		case <-timer.C:
			timer.Reset(keepalive)
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("command timed out"))
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}

// find returns the running process chosen by sel (pid or tag).
func (s *processService) find(sel *process.ProcessSelector) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if p, ok := s.procs[v.Pid]; ok {
			return p, nil
		}
		return nil, notFoundf("process with pid %d not found", v.Pid)
	case *process.ProcessSelector_Tag:
		for _, p := range s.procs {
			if p.tag != nil && *p.tag == v.Tag {
				return p, nil
			}
		}
		return nil, notFoundf("process with tag %q not found", v.Tag)
	}
	return nil, invalidf("process selector needs a pid or a tag")
}

// List returns the running processes.
func (s *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := &process.ListResponse{}
	for _, p := range s.procs {
		res.Processes = append(res.Processes, &process.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag})
	}
	return connect.NewResponse(res), nil
}

// SendInput writes stdin or terminal input to a process.
func (s *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err == nil {
		err = writeInput(ctx, p, req.Msg.GetInput())
	}
	if err != nil {
		return nil, connectError("SendInput", err)
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func writeInput(ctx context.Context, p *proc, in *process.ProcessInput) error {
	deadline, _ := ctx.Deadline()
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		return p.writeInput(v.Stdin, deadline)
	case *process.ProcessInput_Pty:
		return p.writeInput(v.Pty, deadline)
	}
	return nil
}

// StreamInput writes a client stream of input to one process.
func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			found, err := s.find(ev.Start.GetProcess())
			if err != nil {
				return nil, connectError("StreamInput", err)
			}
			p = found
		case *process.StreamInputRequest_Data:
			if p == nil {
				return nil, connectError("StreamInput", invalidf("the first message must be start"))
			}
			if err := writeInput(ctx, p, ev.Data.GetInput()); err != nil {
				return nil, connectError("StreamInput", err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to a process and its group.
func (s *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case process.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connectError("SendSignal", invalidf("unsupported signal %v", req.Msg.GetSignal()))
	}
	p, err := s.find(req.Msg.GetProcess())
	if err == nil {
		err = p.signal(sig)
	}
	if err != nil {
		return nil, connectError("SendSignal", err)
	}
	if sig == syscall.SIGKILL {
		// Answer once the process is gone (reaped), up to killWait: a
		// `kill -0 <pid>` sent right after the answer must not find it.
		// Over E2B's network the round trip hides the moment between.
		t := time.NewTimer(killWait)
		defer t.Stop()
		select {
		case <-p.reaped:
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

// killWait bounds how long SendSignal(SIGKILL) waits for the process to be
// reaped.
const killWait = 2 * time.Second

// CloseStdin closes the stdin pipe of a process.
func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err == nil {
		err = p.closeStdin()
	}
	if err != nil {
		return nil, connectError("CloseStdin", err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// Update resizes the terminal of a PTY process.
func (s *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err == nil && req.Msg.GetPty() != nil {
		size := req.Msg.GetPty().GetSize()
		err = p.resize(size.GetCols(), size.GetRows())
	}
	if err != nil {
		return nil, connectError("Update", err)
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
