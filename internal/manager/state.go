package manager

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// phase is where a sandbox is in its life. It is one field: every
// operation names the phases it accepts (begin) and is refused in the
// others with one style of error.
//
//	running --Pause--> frozen --(SpillAfter, or Pause spill)--> spilled
//	   ^                 |                                         |
//	   +----Connect------+-------------Connect (restore)-----------+
//	any --Kill, or its box dies--> dead
type phase uint8

const (
	running phase = iota + 1 // its box runs
	frozen                   // paused, its box frozen in memory
	spilled                  // paused, its state on disk, no box
	dead                     // killed or died: must not be used
)

func (p phase) String() string {
	switch p {
	case running:
		return "running"
	case frozen:
		return "paused"
	case spilled:
		return "paused on disk"
	case dead:
		return "gone"
	}
	return fmt.Sprintf("phase(%d)", p)
}

// paused reports whether the API calls the sandbox paused.
func (p phase) paused() bool { return p == frozen || p == spilled }

// Live is a sandbox this daemon knows.
//
// op serializes its lifecycle operations: an operation holds it from its
// checks to its last write, across runtime calls. mu guards the fields
// below for readers (Get, List, the data plane), who never wait for an
// operation: the fields are written only while holding both, and read
// while holding either.
type Live struct {
	op sync.Mutex
	mu sync.Mutex

	phase phase
	rec   *sandbox.Sandbox
	box   *box.Box // nil while spilled
	timer *time.Timer
	// spills counts the sandbox's moves to disk (this daemon's): an
	// upload, which runs without op, records its root only if the spill it
	// read is still the sandbox's.
	spills uint64
	// stopUpload cancels the upload of its spill that is running, if any
	// (guarded by op): a resume or a kill makes it useless, and it would
	// take the CPU the restore needs.
	stopUpload context.CancelFunc
}

// leaveDisk cancels a running upload of l's spill. Caller holds op.
func (l *Live) leaveDisk() {
	if l.stopUpload != nil {
		l.stopUpload()
		l.stopUpload = nil
	}
}

func newLive(rec *sandbox.Sandbox, b *box.Box) *Live {
	l := &Live{rec: rec, box: b, phase: running}
	switch {
	case rec.State == sandbox.StatePaused && b == nil:
		l.phase = spilled
	case rec.State == sandbox.StatePaused:
		l.phase = frozen
	}
	return l
}

// update applies f to the fields under mu. Caller holds op.
func (l *Live) update(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f()
}

// setPhase moves l to p, keeping the record's state in step. Caller holds
// op.
func (l *Live) setPhase(p phase) {
	l.update(func() {
		l.phase = p
		l.rec.State = sandbox.StateRunning
		if p.paused() {
			l.rec.State = sandbox.StatePaused
		}
	})
}

// team returns the sandbox's team (never changes).
func (l *Live) team() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec.Team
}

// record returns a copy of the record, nil once dead.
func (l *Live) record() *sandbox.Sandbox {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.phase == dead {
		return nil
	}
	return cloneRecord(l.rec)
}

// require returns nil if l is in one of the phases allowed, else the error
// of an operation refused in l's phase: NotFound once dead, AlreadyExists
// for pausing a paused sandbox (E2B's 409), FailedPrecondition otherwise.
// Caller holds op.
func (l *Live) require(doing string, allowed ...phase) error {
	for _, p := range allowed {
		if l.phase == p {
			return nil
		}
	}
	id := l.rec.ID
	switch {
	case l.phase == dead:
		return errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	case l.phase.paused() && doing == "pausing it":
		return errdefs.New(errdefs.ErrAlreadyExists, "sandbox %q is already paused", id)
	case l.phase.paused():
		return errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is paused: resume it before %s", id, doing)
	}
	return errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is %s: %s is not possible now", id, l.phase, doing)
}

// endpoint returns l's endpoint (Transport and Alive only while it runs)
// and phase.
func (l *Live) endpoint() (sandbox.Endpoint, phase) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ep := sandbox.Endpoint{Sandbox: cloneRecord(l.rec)}
	if l.phase == running {
		ep.Transport, ep.Alive = l.box.Transport, l.box.Alive()
	}
	return ep, l.phase
}

func cloneRecord(r *sandbox.Sandbox) *sandbox.Sandbox {
	c := *r
	c.Metadata = maps.Clone(r.Metadata)
	c.Envs = maps.Clone(r.Envs)
	c.Network = r.Network.Clone()
	return &c
}
