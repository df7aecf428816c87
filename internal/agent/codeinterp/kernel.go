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
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/agent"
)

// spawnSpec is everything a kernel process needs to start.
type spawnSpec struct {
	python  string // interpreter binary
	script  string // kernel.py
	cwd     string
	env     []string
	cred    *syscall.Credential // nil: run as the agent's own user
	baseEnv map[string]string   // sandbox-wide variables already in env
	timeout time.Duration       // until the kernel reports ready
	log     *slog.Logger
}

// kernel is one running kernel.py process (see kernel.py for the protocol).
// Safe for concurrent use, but it runs one execution at a time: callers
// serialize run through their code context.
type kernel struct {
	pid  int
	cmdW *os.File // the kernel's fd 3
	log  *slog.Logger
	diag *tail

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

// startKernel spawns kernel.py and waits until it is ready for commands.
func startKernel(ctx context.Context, s spawnSpec) (*kernel, error) {
	var pipes [6]*os.File // cmdR, cmdW, evR, evW, diagR, diagW
	for i := 0; i < len(pipes); i += 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(pipes[:i]...)
			return nil, fmt.Errorf("creating kernel pipes: %w", err)
		}
		pipes[i], pipes[i+1] = r, w
	}
	cmdR, cmdW, evR, evW, diagR, diagW := pipes[0], pipes[1], pipes[2], pipes[3], pipes[4], pipes[5]
	cmd := exec.Command(s.python, s.script)
	cmd.Dir, cmd.Env = s.cwd, s.env
	cmd.Stdout, cmd.Stderr = diagW, diagW
	cmd.ExtraFiles = []*os.File{cmdR, evW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	err := agent.StartChild(cmd)
	closeAll(cmdR, evW, diagW)
	if err != nil {
		closeAll(cmdW, evR, diagR)
		return nil, fmt.Errorf("starting %s: %w", s.python, err)
	}
	k := &kernel{
		pid: cmd.Process.Pid, cmdW: cmdW, diag: &tail{}, sentEnv: maps.Clone(s.baseEnv),
		waited: make(chan struct{}), diagDone: make(chan struct{}), done: make(chan struct{}),
	}
	k.log = s.log.With("kernel.pid", k.pid)
	ready := make(chan struct{})
	go k.logDiag(diagR)
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
	k.cmdW.Close()
}

func (k *kernel) deliver(line []byte) {
	k.mu.Lock()
	ex := k.cur
	k.mu.Unlock()
	if ex == nil {
		return
	}
	select {
	case ex.lines <- line:
	case <-ex.gone:
	}
}

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
func (k *kernel) run(ctx context.Context, command []byte, out *ndjson, t timing) {
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
	var escalate <-chan time.Time
	interrupts := 0
	for {
		select {
		case line := <-ex.lines:
			if k.forward(line, ex, out) {
				return
			}
		case <-k.done:
			k.lostKernel(ex, out)
			return
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

// forward writes line and the lines already waiting behind it in one
// flush. It reports whether the kernel said "done" (the caller's
// end_of_execution then flushes what was buffered).
func (k *kernel) forward(line []byte, ex *execution, out *ndjson) (done bool) {
	for {
		if bytes.HasPrefix(line, doneType) {
			return true
		}
		out.event(line)
		select {
		case line = <-ex.lines:
			continue
		default:
		}
		out.flush()
		return false
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
			if !bytes.HasPrefix(line, doneType) {
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
