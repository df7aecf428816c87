package manager

import (
	"context"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// admission bounds how many sandbox starts (boots and restores) run at once,
// so that a burst queues instead of thrashing the CPUs. Waiters are served
// in arrival order; past maxWaiters, or after maxWait, a request is refused
// with ErrUnavailable (HTTP 503 with Retry-After). Safe for concurrent use.
type admission struct {
	slots   chan struct{}
	waiting chan struct{} // one token per waiter
	maxWait time.Duration
}

func newAdmission(concurrency, maxWaiters int, maxWait time.Duration) *admission {
	return &admission{
		slots:   make(chan struct{}, concurrency),
		waiting: make(chan struct{}, maxWaiters),
		maxWait: maxWait,
	}
}

// acquire waits for a slot; the caller must call the returned release.
func (a *admission) acquire(ctx context.Context) (func(), error) {
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

// tryAcquire takes a slot only if one is free and nobody is waiting: how
// background work (pool refill) stays out of the foreground's way.
func (a *admission) tryAcquire() (func(), bool) {
	if len(a.waiting) > 0 {
		return nil, false
	}
	select {
	case a.slots <- struct{}{}:
		return a.release, true
	default:
		return nil, false
	}
}

func (a *admission) release() { <-a.slots }

// idle reports whether no start runs or waits.
func (a *admission) idle() bool { return len(a.slots) == 0 && len(a.waiting) == 0 }
