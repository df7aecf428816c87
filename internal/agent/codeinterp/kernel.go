package codeinterp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/agent"
)

// spawnSpec is everything a kernel process needs to start.
type spawnSpec struct {
	argv    []string // kernel.py under python, or a foreign kernel (foreign.go)
	foreign bool
	mark    string // the end-of-cell mark of a foreign kernel's output
	cwd     string
	env     []string
	cred    *syscall.Credential // nil: run as the agent's own user
	baseEnv map[string]string   // sandbox-wide variables already in env
	timeout time.Duration       // until the kernel reports ready
	log     *slog.Logger
}

// kernel is one running kernel process: kernel.py (see kernel.py for its
// protocol) or a foreign kernel (foreign.go). Safe for concurrent use, but
// it runs one execution at a time: callers serialize run through their code
// context.
type kernel struct {
	pid     int
	cmdW    *os.File // the kernel's fd 3
	log     *slog.Logger
	diag    *tail
	foreign bool
	ready   atomic.Bool // "ready" was read: a foreign kernel's fd 1 and 2 are output

	mu  sync.Mutex
	cur *execution // receives event lines; nil between executions

	// Touched only by the execution holding the context's run slot.
	seq     uint64
	sentEnv map[string]string

	waited   chan struct{} // closed once the process has been reaped
	state    string        // how the process ended; set before waited closes
	diagDone chan struct{} // closed when the diagnostic output ended
	done     chan struct{} // closed after the last event line was delivered
}

// execution is the receiving end of one run.
type execution struct {
	lines chan []byte
	gone  chan struct{} // closed when the run stops listening
}

// timing holds the durations of a run.
type timing struct {
	keepalive  time.Duration // between keepalive lines
	grace      time.Duration // between interrupts of an abandoned run
	interrupts int           // SIGINTs before the kernel is killed
}

var (
	doneType  = []byte(`{"type":"done"`)
	readyType = []byte(`{"type":"ready"`)
	eventType = []byte(`{"type":"`)
)

// startKernel spawns a kernel and waits until it is ready for commands.
func startKernel(ctx context.Context, s spawnSpec) (*kernel, error) {
	// cmdR, cmdW, evR, evW, outR, outW, errR, errW (a Python kernel's fd 1
	// and 2 share one diagnostics pipe: the last two stay nil).
	var pipes [8]*os.File
	n := 6
	if s.foreign {
		n = 8
	}
	for i := 0; i < n; i += 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(pipes[:i]...)
			return nil, fmt.Errorf("creating kernel pipes: %w", err)
		}
		pipes[i], pipes[i+1] = r, w
	}
	cmdR, cmdW, evR, evW, outR, outW, errR, errW := pipes[0], pipes[1], pipes[2], pipes[3], pipes[4], pipes[5], pipes[6], pipes[7]
	if s.foreign && s.cred != nil {
		// R and the JVM cannot use an inherited descriptor by number: they
		// open /proc/self/fd/3 and 4, which needs the pipes to be the
		// kernel user's.
		for _, f := range []*os.File{cmdR, evW} {
			if err := f.Chown(int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				closeAll(pipes[:n]...)
				return nil, fmt.Errorf("giving the kernel its pipes: %w", err)
			}
		}
	}
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	cmd.Dir, cmd.Env = s.cwd, s.env
	cmd.Stdout, cmd.Stderr = outW, outW
	if s.foreign {
		cmd.Stderr = errW
	}
	cmd.ExtraFiles = []*os.File{cmdR, evW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	err := agent.StartChild(cmd)
	closeAll(cmdR, evW, outW, errW)
	if err != nil {
		closeAll(cmdW, evR, outR, errR)
		return nil, fmt.Errorf("starting %s: %w", s.argv[0], err)
	}
	k := &kernel{
		pid: cmd.Process.Pid, cmdW: cmdW, diag: &tail{}, foreign: s.foreign,
		waited: make(chan struct{}), diagDone: make(chan struct{}), done: make(chan struct{}),
	}
	if !s.foreign {
		// kernel.py has the sandbox's variables from its environment; a
		// foreign kernel gets them with its first command too (Java makes
		// them system properties).
		k.sentEnv = maps.Clone(s.baseEnv)
	}
	k.log = s.log.With("kernel.pid", k.pid)
	ready := make(chan struct{})
	if s.foreign {
		var wg sync.WaitGroup
		wg.Go(func() { k.readOutput(outR, "stdout", []byte(s.mark)) })
		wg.Go(func() { k.readOutput(errR, "stderr", []byte(s.mark)) })
		go func() { wg.Wait(); close(k.diagDone) }()
	} else {
		go k.logDiag(outR)
	}
	go k.reap(cmd, evR)
	go k.readEvents(evR, ready)

	timer := time.NewTimer(s.timeout)
	defer timer.Stop()
	select {
	case <-ready:
		k.log.Debug("kernel ready")
		return k, nil
	case <-k.done:
		return nil, fmt.Errorf("kernel exited while starting (%s): %s", k.exitState(), k.diagnostics())
	case <-timer.C:
		err = fmt.Errorf("kernel not ready after %s: %s", s.timeout, k.diag.String())
	case <-ctx.Done():
		err = fmt.Errorf("starting kernel: %w", ctx.Err())
	}
	k.kill()
	return nil, err
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// reap waits for the process. If the event stream stays open after it
// exited (a grandchild kept fd 4), the stream is closed so the kernel is
// known to be dead.
func (k *kernel) reap(cmd *exec.Cmd, evR *os.File) {
	err := cmd.Wait()
	agent.ChildDone(cmd.Process.Pid)
	if cmd.ProcessState != nil {
		k.state = cmd.ProcessState.String()
	} else {
		k.state = err.Error()
	}
	close(k.waited)
	select {
	case <-k.done:
	case <-time.After(time.Second):
		evR.Close()
	}
}

// readEvents delivers the kernel's event lines to the running execution.
// Lines that arrive between executions (from background threads) are
// dropped.
func (k *kernel) readEvents(evR *os.File, ready chan struct{}) {
	defer close(k.done)
	br := bufio.NewReaderSize(evR, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			break // a partial last line is dropped
		}
		if ready != nil {
			if bytes.HasPrefix(line, readyType) {
				k.ready.Store(true)
				close(ready)
				ready = nil
			}
			continue
		}
		k.deliver(line)
	}
	evR.Close()
	select {
	case <-k.waited:
	case <-time.After(time.Second):
		k.log.Warn("kernel closed its events but lives on; killing it")
	}
	// The next kernel starts from a clean slate: what this one started
	// (its process group) goes with it.
	k.kill()
	<-k.waited
	// What it wrote to fd 1 and 2 before it died belongs to the running
	// execution: let the readers deliver it (they end at EOF, now that
	// the writers are gone).
	select {
	case <-k.diagDone:
	case <-time.After(time.Second):
	}
	k.cmdW.Close()
}

// deliver hands a line to the running execution and reports whether there
// was one.
func (k *kernel) deliver(line []byte) bool {
	k.mu.Lock()
	ex := k.cur
	k.mu.Unlock()
	if ex == nil {
		return false
	}
	select {
	case ex.lines <- line:
		return true
	case <-ex.gone:
		return false
	}
}

func (k *kernel) isReady() bool { return k.ready.Load() }

func (k *kernel) logDiag(r *os.File) {
	defer close(k.diagDone)
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		k.diag.add(sc.Text())
		k.log.Warn("kernel diagnostic output", "line", sc.Text())
	}
}

// diagnostics returns the end of the kernel's diagnostic output, waiting
// briefly for a dead kernel's last words.
func (k *kernel) diagnostics() string {
	select {
	case <-k.diagDone:
	case <-time.After(time.Second):
	}
	return k.diag.String()
}

// exitState describes how the process ended, once it was reaped.
func (k *kernel) exitState() string {
	select {
	case <-k.waited:
		return k.state
	default:
		return "still running"
	}
}

// exited reports whether the kernel's event stream has ended.
func (k *kernel) exited() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the kernel's process group (the kernel and the
// processes it started), like a terminal's Ctrl-C.
func (k *kernel) signal(sig syscall.Signal) {
	if err := syscall.Kill(-k.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		k.log.Warn("signalling kernel", "signal", sig, "err", err)
	}
}

// kill ends the kernel and everything in its process group.
func (k *kernel) kill() {
	k.signal(syscall.SIGKILL)
}

// stop kills the kernel and waits (bounded) until it is gone.
func (k *kernel) stop(timeout time.Duration) {
	k.kill()
	select {
	case <-k.done:
	case <-time.After(timeout):
		k.log.Warn("kernel did not exit after SIGKILL", "timeout", timeout)
	}
}

// command encodes an execution for the kernel. The sandbox-wide variables
// are sent only when they changed since the kernel last saw them.
func (k *kernel) command(code string, sandboxEnv, env map[string]string) ([]byte, error) {
	k.seq++
	if k.foreign {
		var send map[string]string
		if !maps.Equal(sandboxEnv, k.sentEnv) {
			send = sandboxEnv
			k.sentEnv = sandboxEnv
		}
		return frameCommand(k.seq, code, send, env), nil
	}
	cmd := struct {
		ID     uint64            `json:"id"`
		Code   string            `json:"code"`
		Env    map[string]string `json:"env,omitempty"`
		TmpEnv map[string]string `json:"tmp_env,omitempty"`
	}{ID: k.seq, Code: code, TmpEnv: env}
	if !maps.Equal(sandboxEnv, k.sentEnv) {
		cmd.Env = sandboxEnv
		k.sentEnv = sandboxEnv
	}
	b, err := json.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("encoding command: %w", err)
	}
	return append(b, '\n'), nil
}

// run sends one command and streams its events to out until the kernel
// reports it done or dies. When ctx ends first (the client went away) the
// cell is interrupted with SIGINT, repeated every t.grace; after
// t.interrupts tries the kernel is killed. The stream is consumed to the
// end either way, so the kernel is idle (or dead) when run returns.
//
// run reports whether the kernel took the command. Every kernel says
// number_of_executions before it runs a cell, so a kernel that died before
// saying anything ran nothing (it was killed while idle, and the agent had
// not yet seen it go): run then writes nothing, and the caller may run the
// command on a fresh kernel.
func (k *kernel) run(ctx context.Context, command []byte, out *ndjson, t timing) (taken bool) {
	ex := &execution{lines: make(chan []byte, 64), gone: make(chan struct{})}
	k.mu.Lock()
	k.cur = ex
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		k.cur = nil
		k.mu.Unlock()
		close(ex.gone)
	}()
	if _, err := k.cmdW.Write(command); err != nil {
		k.log.Warn("sending command to kernel", "err", err) // it died: k.done follows
	}
	tick := time.NewTicker(t.keepalive)
	defer tick.Stop()
	cancelled := ctx.Done()
	var escalate, markWait <-chan time.Time
	interrupts := 0
	var st runState
	for {
		select {
		case line := <-ex.lines:
			taken = true
			k.forward(line, ex, out, &st)
			if st.finished(k.foreign) {
				return true
			}
			if st.done && markWait == nil {
				markWait = time.After(markTimeout)
			}
		case <-markWait:
			// Its output is broken (a cell closed its fd 1 or 2): a late
			// mark must not end the next execution early.
			k.log.Warn("kernel did not mark the end of its output; killing it", "marks", st.marks)
			k.kill()
			return true
		case <-k.done:
			if !taken && len(ex.lines) == 0 && interrupts == 0 {
				return false
			}
			k.lostKernel(ex, out)
			return true
		case <-tick.C:
			out.write(keepaliveLine)
		case <-cancelled:
			cancelled = nil
			out.discard()
			escalate = k.interrupt(&interrupts, t)
		case <-escalate:
			escalate = k.interrupt(&interrupts, t)
		}
	}
}

// runState is how far an execution got.
type runState struct {
	done  bool // the kernel said "done"
	marks int  // marks read from a foreign kernel's fd 1 and 2
}

// finished reports whether the execution is over: "done", and for a
// foreign kernel the marks of both output streams.
func (st runState) finished(foreign bool) bool {
	return st.done && (!foreign || st.marks >= 2)
}

// forward writes line and the lines already waiting behind it in one
// flush, until the execution is finished (the caller's end_of_execution
// then flushes what was buffered).
func (k *kernel) forward(line []byte, ex *execution, out *ndjson, st *runState) {
	for {
		switch {
		case bytes.HasPrefix(line, doneType):
			st.done = true
		case len(line) > 0 && line[0] == 0: // a mark
			st.marks++
		default:
			out.event(line)
		}
		if st.finished(k.foreign) {
			return
		}
		select {
		case line = <-ex.lines:
			continue
		default:
		}
		out.flush()
		return
	}
}

// interrupt sends the next SIGINT, or SIGKILL once t.interrupts were sent.
func (k *kernel) interrupt(sent *int, t timing) <-chan time.Time {
	if *sent >= t.interrupts {
		k.log.Warn("kernel ignored interrupts; killing it", "interrupts", *sent)
		k.kill()
		return nil
	}
	*sent++
	k.signal(syscall.SIGINT)
	return time.After(t.grace)
}

// lostKernel forwards the lines the dead kernel still sent and reports the
// end of the execution as upstream does.
func (k *kernel) lostKernel(ex *execution, out *ndjson) {
	for {
		select {
		case line := <-ex.lines:
			if !bytes.HasPrefix(line, doneType) && len(line) > 0 && line[0] != 0 {
				out.event(line)
			}
			continue
		default:
		}
		break
	}
	state := k.exitState()
	k.log.Warn("kernel died during execution", "state", state)
	// The traceback is the kernel's last words, e.g. a segfault's stack.
	out.write(errorLine("UnexpectedEndOfExecution",
		"the kernel exited unexpectedly ("+state+"); the next execution starts a fresh one",
		k.diagnostics()))
}

// tail keeps the last lines of a kernel's diagnostic output for error
// messages. Safe for concurrent use.
type tail struct {
	mu    sync.Mutex
	lines []string
}

const tailLines = 20

func (t *tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, line)
	if len(t.lines) > tailLines {
		t.lines = t.lines[len(t.lines)-tailLines:]
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var b bytes.Buffer
	for i, l := range t.lines {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(l)
	}
	return b.String()
}
