package envd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/cellfork/cellfork/internal/agent"
	"github.com/cellfork/cellfork/internal/envd/process"
)

const (
	// readChunk is the largest data event a process produces.
	readChunk = 32 << 10
	// drainIdle is how long output is still read after the process exited
	// while nothing arrives; it bounds the wait for grandchildren that keep
	// the pipes open (`sleep 100 &`).
	drainIdle = 100 * time.Millisecond
)

// procSpec is a validated StartRequest.
type procSpec struct {
	acc    agent.Account
	path   string // resolved executable
	dir    string
	env    []string
	base   []string // env without the request's variables
	req    *process.StartRequest
	groups []uint32
}

// proc is one process started through Start. Safe for concurrent use.
type proc struct {
	pid    uint32
	config *process.ProcessConfig
	tag    *string
	cmd    *exec.Cmd
	out    *output
	tty    *os.File // PTY master; nil for pipe processes

	readers []*os.File
	pumps   sync.WaitGroup

	exited   atomic.Bool   // set as soon as the process is reaped
	timedOut atomic.Bool   // set when the deadline killed it
	reaped   chan struct{} // closed when exited is set

	stdinMu sync.Mutex
	stdin   *os.File // nil when disabled or closed
}

// wantsStdin says whether the process gets a stdin pipe (the default).
func (spec procSpec) wantsStdin() bool { return spec.req.Stdin == nil || spec.req.GetStdin() }

// newProc is the proc of spec running as cmd, publishing to out.
func newProc(spec procSpec, cmd *exec.Cmd, out *output) *proc {
	return &proc{config: spec.req.GetProcess(), tag: spec.req.Tag, cmd: cmd, out: out, reaped: make(chan struct{})}
}

// startProc starts the process described by spec, publishing its output to
// out (subscribe before calling to see all of it). The process is killed
// when ctx is done before it exits; cancel is called once it has exited.
func startProc(ctx context.Context, cancel context.CancelFunc, spec procSpec, out *output) (*proc, error) {
	cmd := &exec.Cmd{
		Path: spec.path,
		Args: append([]string{spec.req.GetProcess().GetCmd()}, spec.req.GetProcess().GetArgs()...),
		Env:  spec.env,
		Dir:  spec.dir,
		SysProcAttr: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: spec.acc.UID, Gid: spec.acc.GID, Groups: spec.groups},
		},
	}
	p := newProc(spec, cmd, out)
	var childEnds []*os.File
	var err error
	if spec.req.GetPty() != nil {
		childEnds, err = p.setupPTY(spec)
	} else {
		childEnds, err = p.setupPipes(spec.wantsStdin())
	}
	if err == nil {
		err = agent.StartChild(cmd)
	}
	for _, f := range childEnds {
		_ = f.Close()
	}
	if err != nil {
		p.closeParentEnds()
		return nil, invalidf("starting %s: %w", p.config.GetCmd(), err)
	}
	p.pid = uint32(cmd.Process.Pid)
	p.run(ctx, cancel)
	return p, nil
}

// run follows a started process: its output, its deadline, its end.
func (p *proc) run(ctx context.Context, cancel context.CancelFunc) {
	for _, r := range p.readers {
		p.pumps.Go(func() { p.pump(r) })
	}
	go p.killAtDeadline(ctx)
	go p.wait(cancel)
}

func (p *proc) setupPipes(withStdin bool) (childEnds []*os.File, err error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_ = outR.Close()
		_ = outW.Close()
		return nil, fmt.Errorf("creating stderr pipe: %w", err)
	}
	p.readers = []*os.File{outR, errR}
	p.cmd.Stdout, p.cmd.Stderr = outW, errW
	childEnds = []*os.File{outW, errW}
	if withStdin {
		inR, inW, err := os.Pipe()
		if err != nil {
			return childEnds, fmt.Errorf("creating stdin pipe: %w", err)
		}
		p.stdin = inW
		p.cmd.Stdin = inR
		childEnds = append(childEnds, inR)
	}
	// A process group of its own lets signals and the deadline reach the
	// whole pipeline, not just the shell.
	p.cmd.SysProcAttr.Setpgid = true
	return childEnds, nil
}

func (p *proc) setupPTY(spec procSpec) (childEnds []*os.File, err error) {
	master, tty, err := openPTY()
	if err != nil {
		return nil, fmt.Errorf("opening pty: %w", err)
	}
	p.tty = master
	p.readers = []*os.File{master}
	size := spec.req.GetPty().GetSize()
	if err := p.resize(size.GetCols(), size.GetRows()); err != nil {
		return []*os.File{tty}, err
	}
	// Best effort: programs that reopen their terminal need to own it.
	_ = os.Chown(tty.Name(), int(spec.acc.UID), int(spec.acc.GID))
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = tty, tty, tty
	p.cmd.SysProcAttr.Setsid = true
	p.cmd.SysProcAttr.Setctty = true
	p.cmd.SysProcAttr.Ctty = 0
	return []*os.File{tty}, nil
}

// openPTY opens a pseudo-terminal whose master is non-blocking, so reads can
// be bounded by deadlines and interrupted by Close.
func openPTY() (master, tty *os.File, err error) {
	m, t, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	fd, err := unix.Dup(int(m.Fd()))
	if err != nil {
		_ = t.Close()
		return nil, nil, fmt.Errorf("duplicating pty master: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		_ = t.Close()
		return nil, nil, fmt.Errorf("making pty master non-blocking: %w", err)
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), m.Name()), t, nil
}

// resize sets the terminal size; zero values become 80x24.
func (p *proc) resize(cols, rows uint32) error {
	if p.tty == nil {
		return preconditionf("process %d has no pty", p.pid)
	}
	if p.exited.Load() {
		return notFoundf("process %d has exited", p.pid)
	}
	if cols == 0 {
		cols = 80
	}
	if rows == 0 {
		rows = 24
	}
	ws := &unix.Winsize{Col: uint16(min(cols, 0xffff)), Row: uint16(min(rows, 0xffff))}
	conn, err := p.tty.SyscallConn()
	if err != nil {
		return fmt.Errorf("resizing pty: %w", err)
	}
	var ioctlErr error
	if err := conn.Control(func(fd uintptr) { ioctlErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, ws) }); err != nil {
		return fmt.Errorf("resizing pty: %w", err)
	}
	if ioctlErr != nil {
		return fmt.Errorf("resizing pty: %w", ioctlErr)
	}
	return nil
}

// pump copies one output stream into data events until EOF, or until it has
// been idle for drainIdle after the process exited.
func (p *proc) pump(f *os.File) {
	buf := make([]byte, readChunk)
	for {
		if p.exited.Load() {
			_ = f.SetReadDeadline(time.Now().Add(drainIdle))
		}
		n, err := f.Read(buf)
		if n > 0 {
			p.out.publish(p.dataEvent(f, bytes.Clone(buf[:n])))
		}
		if err != nil {
			return
		}
	}
}

func (p *proc) dataEvent(f *os.File, b []byte) *process.ProcessEvent_DataEvent {
	switch {
	case f == p.tty:
		return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: b}}
	case f == p.readers[0]:
		return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: b}}
	default:
		return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: b}}
	}
}

// wait reaps the process, drains its output and publishes the end event.
func (p *proc) wait(cancel context.CancelFunc) {
	waitErr := p.cmd.Wait()
	agent.ChildDone(int(p.pid))
	p.exited.Store(true)
	close(p.reaped)
	for _, f := range p.readers {
		_ = f.SetReadDeadline(time.Now().Add(drainIdle))
	}
	p.pumps.Wait()
	p.closeParentEnds()
	cancel()

	st := p.cmd.ProcessState
	end := &process.ProcessEvent_EndEvent{
		ExitCode: int32(st.ExitCode()),
		Exited:   st.Exited(),
		Status:   st.String(),
	}
	if waitErr != nil {
		msg := waitErr.Error()
		end.Error = &msg
	}
	p.out.finish(end)
}

func (p *proc) closeParentEnds() {
	for _, f := range p.readers {
		_ = f.Close()
	}
	p.stdinMu.Lock()
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
	}
	p.stdinMu.Unlock()
}

// killAtDeadline kills the process group when ctx expires first.
func (p *proc) killAtDeadline(ctx context.Context) {
	select {
	case <-p.reaped:
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			p.timedOut.Store(true)
			_ = p.signal(syscall.SIGKILL)
		}
	}
}

// signal sends sig to the process group (the process is always a group
// leader), falling back to the process itself.
func (p *proc) signal(sig syscall.Signal) error {
	if p.exited.Load() {
		return notFoundf("process %d has already exited", p.pid)
	}
	if err := syscall.Kill(-int(p.pid), sig); err == nil {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return notFoundf("process %d has already exited", p.pid)
		}
		return fmt.Errorf("signalling process %d: %w", p.pid, err)
	}
	return nil
}

// writeInput writes to the terminal of a PTY process or to the stdin pipe
// of a pipe process. deadline bounds a write the process does not read.
func (p *proc) writeInput(data []byte, deadline time.Time) error {
	if p.tty != nil {
		_ = p.tty.SetWriteDeadline(deadline)
		if _, err := p.tty.Write(data); err != nil {
			return p.inputError(err)
		}
		return nil
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return preconditionf("stdin of process %d is not enabled or already closed", p.pid)
	}
	_ = p.stdin.SetWriteDeadline(deadline)
	if _, err := p.stdin.Write(data); err != nil {
		return p.inputError(err)
	}
	return nil
}

func (p *proc) inputError(err error) error {
	if p.exited.Load() || errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) {
		return notFoundf("process %d has exited", p.pid)
	}
	return fmt.Errorf("writing input of process %d: %w", p.pid, err)
}

// closeStdin closes the stdin pipe so the process reads EOF.
func (p *proc) closeStdin() error {
	if p.tty != nil {
		return preconditionf("process %d uses a pty: send Ctrl+D (0x04) instead of closing stdin", p.pid)
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	if err != nil {
		return fmt.Errorf("closing stdin of process %d: %w", p.pid, err)
	}
	return nil
}
