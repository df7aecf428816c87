package pool

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Admission bounds how many sandbox starts (boots and restores) run at once,
// so that a burst queues instead of thrashing the CPUs. Waiters are served
// in arrival order; past maxWaiters, or after maxWait, a request is refused
// with ErrUnavailable (HTTP 503 with Retry-After). Background work (the
// pool's refill) runs only while no request holds or waits for a slot and
// no other foreground work runs (busy: a checkpoint, a restored box's
// hand-off): restores, checkpoints and a new sandbox's first requests are
// CPU-bound, and so is a refill. Speculative background work (standbys)
// also waits IdleGrace after the last foreground work ended, so that the
// client's next request (the first run_code after a rollback) goes first.
// Safe for concurrent use.
type Admission struct {
	slots      chan struct{}
	waiting    chan struct{} // one token per waiter
	foreground atomic.Int32  // requests holding or waiting for a slot, and busy work
	lastEnd    atomic.Int64  // when foreground work last ended (UnixNano)
	maxWait    time.Duration
	onIdle     func() // called when the last foreground work ends, and IdleGrace later
}

// IdleGrace is how long speculative background work waits after
// foreground work.
const IdleGrace = 250 * time.Millisecond

func NewAdmission(concurrency, maxWaiters int, maxWait time.Duration, onIdle func()) *Admission {
	return &Admission{
		slots:   make(chan struct{}, concurrency),
		waiting: make(chan struct{}, maxWaiters),
		maxWait: maxWait,
		onIdle:  onIdle,
	}
}

// Acquire waits for a slot; the caller must call the returned release.
func (a *Admission) Acquire(ctx context.Context) (func(), error) {
	a.foreground.Add(1)
	release, err := a.wait(ctx)
	if err != nil {
		a.releaseForeground()
		return nil, err
	}
	return func() { release(); a.releaseForeground() }, nil
}

// Busy marks foreground work that needs no slot (a checkpoint, a create
// served from the pool until its hand-off is done) until the returned func
// is called, so that no refill competes with it either.
func (a *Admission) Busy() func() {
	a.foreground.Add(1)
	return a.releaseForeground
}

func (a *Admission) releaseForeground() {
	if a.foreground.Add(-1) == 0 {
		a.lastEnd.Store(time.Now().UnixNano())
		if a.onIdle != nil {
			a.onIdle()
			time.AfterFunc(IdleGrace, a.onIdle)
		}
	}
}

func (a *Admission) wait(ctx context.Context) (func(), error) {
	select {
	case a.slots <- struct{}{}:
		return a.release, nil
	default:
	}
	select {
	case a.waiting <- struct{}{}:
	default:
		return nil, errdefs.New(errdefs.ErrUnavailable, "server busy: %d sandbox starts already queued, retry later", cap(a.waiting))
	}
	defer func() { <-a.waiting }()
	t := time.NewTimer(a.maxWait)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		return a.release, nil
	case <-t.C:
		return nil, errdefs.New(errdefs.ErrUnavailable, "server busy: no sandbox start slot within %s, retry later", a.maxWait)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TryAcquire takes a slot only if no foreground work runs (and, for
// speculative work, none ended less than IdleGrace ago): how background
// work (pool refill) stays out of the foreground's way.
func (a *Admission) TryAcquire(speculative bool) (func(), bool) {
	if a.foreground.Load() > 0 || speculative && time.Since(time.Unix(0, a.lastEnd.Load())) < IdleGrace {
		return nil, false
	}
	select {
	case a.slots <- struct{}{}:
		return a.release, true
	default:
		return nil, false
	}
}

func (a *Admission) release() { <-a.slots }

// Pending counts the starts running or waiting.
func (a *Admission) Pending() int { return len(a.slots) + len(a.waiting) }

// Idle reports whether no start runs or waits.
func (a *Admission) Idle() bool { return len(a.slots) == 0 && a.foreground.Load() == 0 }
