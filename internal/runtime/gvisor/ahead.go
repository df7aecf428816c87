package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// Restores started ahead. A `runsc restore` into a prepared sandbox spent
// about 15 ms before the sentry heard of it: the start of a 100 MB static
// binary, its configuration and state file, and the scrape of the
// sandbox's network namespace. With gVisor patch 0023 (restore-ahead),
// `runsc restore --image-path=-` does all of that and then waits for the
// image's path on its standard input, so Prepare starts one beside every
// prepared sandbox and a Restore into it only writes the path. Nothing is
// locked while it waits; Destroy ends it, and a restore whose command
// ended early, or whose flags differ from the command's, runs a new
// command as before.

// restoresAhead holds the waiting commands by sandbox.
type restoresAhead struct {
	supported bool // the runsc build has 0023
	mu        sync.Mutex
	m         map[string]*aheadRestore
}

type aheadRestore struct {
	args  []string // its whole command line, "-" where the image goes
	stdin io.WriteCloser
	proc  *os.Process
	done  chan struct{} // closed when the command has exited; err is then set
	err   error
}

// aheadSupported reports whether runsc knows `--image-path=-` (what its
// restore's help says of the flag).
func aheadSupported(runsc string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, runsc, "help", "restore").CombinedOutput()
	return strings.Contains(string(out), `"-": a created container's network is set up first`)
}

// startAhead starts s's restore, to wait for its image. s has just been
// prepared; out takes the command's output.
func (r *Runtime) startAhead(s sandbox.Spec, out *os.File) {
	if !r.ahead.supported {
		return
	}
	args := r.detachedFlags(s, preparedRestore(s, "-")...)
	cmd := exec.Command(r.cfg.Runsc, args...)
	cmd.SysProcAttr = diesWithDaemon()
	cmd.Stdout, cmd.Stderr = out, out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return
	}
	if err := cmd.Start(); err != nil {
		return // Restore runs a command of its own
	}
	a := &aheadRestore{args: args, stdin: stdin, proc: cmd.Process, done: make(chan struct{})}
	go func() {
		a.err = cmd.Wait()
		close(a.done)
	}()
	r.ahead.mu.Lock()
	if r.ahead.m == nil {
		r.ahead.m = map[string]*aheadRestore{}
	}
	old := r.ahead.m[s.RuntimeID]
	r.ahead.m[s.RuntimeID] = a
	r.ahead.mu.Unlock()
	old.end()
}

// restoreAhead restores image into s's prepared sandbox through the command
// started ahead, if there is one that can. done is false when it did not
// try: the caller runs a command of its own.
func (r *Runtime) restoreAhead(ctx context.Context, s sandbox.Spec, image string) (done bool, err error) {
	a := r.ahead.take(s.RuntimeID)
	if a == nil {
		return false, nil
	}
	if !slices.Equal(a.args, r.detachedFlags(s, preparedRestore(s, "-")...)) || strings.ContainsRune(image, '\n') {
		a.end()
		return false, nil
	}
	select {
	case <-a.done: // ended without a path (killed with a thread of the daemon's, or failed)
		return false, nil
	default:
	}
	defer timing.Since(ctx, "restore", time.Now())
	if _, err := io.WriteString(a.stdin, image+"\n"); err != nil {
		// It ended before it read the path: nothing was restored.
		a.end()
		return false, nil
	}
	_ = a.stdin.Close()
	timer := time.NewTimer(detachedTimeout)
	defer timer.Stop()
	select {
	case <-a.done:
	case <-timer.C:
		_ = a.proc.Kill()
		<-a.done
		a.err = errors.Join(fmt.Errorf("timed out after %s", detachedTimeout), a.err)
	}
	return true, r.detachedDone(ctx, s, "restore", a.err)
}

// take removes and returns id's command, if any.
func (ra *restoresAhead) take(id string) *aheadRestore {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	a := ra.m[id]
	delete(ra.m, id)
	return a
}

// stop ends id's command, if any.
func (ra *restoresAhead) stop(id string) { ra.take(id).end() }

// end kills a command that has not been given a path, and waits for it.
func (a *aheadRestore) end() {
	if a == nil {
		return
	}
	_ = a.proc.Kill()
	<-a.done
}
