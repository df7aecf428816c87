package manager

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// TestStressEveryPair runs every pair of lifecycle operations concurrently
// on the same sandboxes and snapshots, many times, under the race detector
// (make test runs go test -race). Any call that does not return within its
// bound fails the test (a deadlock hangs them), and so does any error that
// is not one of the refusals an operation may meet in a race (not found,
// wrong phase, already paused, busy). The integration suite's
// TestConcurrencyStress does the same through HTTP with gVisor.
func TestStressEveryPair(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.PoolReady, c.PoolShells, c.StandbySnapshots = 1, 1, 1 })
	ops := []string{"create", "snapshot", "deleteSnapshot", "fork", "rollback", "merge", "pause", "resume", "kill", "list"}
	w := &stressWorld{e: e}
	for i, a := range ops {
		for _, b := range ops[i:] {
			for round := range 2 {
				w.prepare()
				var wg sync.WaitGroup
				for _, op := range []string{a, b, a, b} {
					wg.Go(func() { w.do(op) })
				}
				wg.Wait()
				if t.Failed() {
					t.Fatalf("%s x %s (round %d)", a, b, round)
				}
			}
			w.trim()
		}
	}
}

const stressBound = 10 * time.Second

type stressWorld struct {
	e        *env
	mu       sync.Mutex
	parent   string
	snaps    []string
	children []string
	created  []string
}

// call runs f with a bound and checks its error.
func (w *stressWorld) call(what string, f func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), stressBound)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrFailedPrecondition) &&
			!errors.Is(err, errdefs.ErrAlreadyExists) && !errors.Is(err, errdefs.ErrUnavailable) {
			w.e.t.Errorf("%s: %v", what, err)
		}
	case <-time.After(stressBound + time.Second):
		w.e.t.Errorf("%s did not return within %v", what, stressBound)
	}
}

func (w *stressWorld) last(list *[]string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(*list) == 0 {
		return "none"
	}
	return (*list)[rand.IntN(len(*list))]
}

func (w *stressWorld) add(list *[]string, id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	*list = append(*list, id)
}

func (w *stressWorld) prepare() {
	m := w.e.m
	w.mu.Lock()
	parent := w.parent
	w.mu.Unlock()
	if _, err := m.Get(context.Background(), parent); err != nil {
		sb, err := m.Create(context.Background(), sandbox.CreateRequest{TemplateID: "base"})
		if err != nil {
			w.e.t.Fatal(err)
		}
		w.mu.Lock()
		w.parent = sb.ID
		w.mu.Unlock()
	}
	w.do("resume")
	w.do("snapshot")
	w.do("fork")
}

func (w *stressWorld) do(op string) {
	m := w.e.m
	w.mu.Lock()
	parent := w.parent
	w.mu.Unlock()
	switch op {
	case "create":
		w.call(op, func(ctx context.Context) error {
			tpl := "base"
			if sn := w.last(&w.snaps); sn != "none" && rand.IntN(2) == 0 {
				tpl = sn
			}
			sb, err := m.Create(ctx, sandbox.CreateRequest{TemplateID: tpl})
			if err == nil {
				w.add(&w.created, sb.ID)
			}
			return err
		})
	case "snapshot":
		w.call(op, func(ctx context.Context) error {
			sn, err := m.Snapshot(ctx, parent, "")
			if err == nil {
				w.add(&w.snaps, sn.ID)
			}
			return err
		})
	case "deleteSnapshot":
		w.call(op, func(ctx context.Context) error { return m.DeleteSnapshot(ctx, w.last(&w.snaps)) })
	case "fork":
		w.call(op, func(ctx context.Context) error {
			res, err := m.Fork(ctx, parent, 1+rand.IntN(2), 0)
			for _, r := range res {
				if r.Err != nil {
					return r.Err
				}
				w.add(&w.children, r.Sandbox.ID)
			}
			return err
		})
	case "rollback":
		w.call(op, func(ctx context.Context) error {
			_, err := m.Rollback(ctx, parent, w.last(&w.snaps))
			return err
		})
	case "merge":
		w.call(op, func(ctx context.Context) error {
			_, err := m.Merge(ctx, parent, w.last(&w.children))
			return err
		})
	case "pause":
		w.call(op, func(ctx context.Context) error {
			return m.Pause(ctx, parent, sandbox.PauseRequest{Spill: rand.IntN(2) == 0})
		})
	case "resume":
		w.call(op, func(ctx context.Context) error {
			_, _, err := m.Connect(ctx, parent, sandbox.ConnectRequest{})
			return err
		})
	case "kill":
		w.call(op, func(ctx context.Context) error {
			target := w.last(&w.children)
			if rand.IntN(4) == 0 {
				target = parent
			}
			return m.Kill(ctx, target)
		})
	case "list":
		w.call(op, func(ctx context.Context) error {
			if _, err := m.List(ctx); err != nil {
				return err
			}
			_, err := m.ListSnapshots(ctx)
			_, _ = m.Get(ctx, parent)
			_, _ = m.Endpoint(ctx, parent, nil)
			_, _ = m.Metrics(ctx, parent, time.Time{}, time.Time{})
			return err
		})
	default:
		panic(fmt.Sprintf("unknown op %q", op))
	}
}

// trim kills the children and created sandboxes.
func (w *stressWorld) trim() {
	w.mu.Lock()
	ids := append(w.children, w.created...)
	w.children, w.created = nil, nil
	w.mu.Unlock()
	for _, id := range ids {
		_ = w.e.m.Kill(context.Background(), id)
	}
}
