package manager

import (
	"context"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cellfork/cellfork/internal/failpoint"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// The hand-off (POST /init) of a restored box is foreground work: no pool
// refill may start beside it. The admission slot of the restore is given
// back when the box runs, and a refill started then (a shell's `runsc
// create`) took the CPUs from the new sandbox's /init.
func TestHandOffIsForeground(t *testing.T) {
	// No standbys: a standby fill hands off its box in the background.
	e := newEnv(t, func(c *Config) { c.PoolReady, c.PoolShells, c.StandbySnapshots = 1, 1, 0 })
	e.settle()
	p := e.create(sandbox.CreateRequest{})
	sn, err := e.m.Snapshot(context.Background(), p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	e.settle()
	// Counted only inside the test's operations, each started once the
	// pool has settled: the pool's own refills and standby fills hand off
	// boxes too, as background work, and one still running when an
	// operation starts is not the operation's.
	var inOp atomic.Bool
	var inits, idle atomic.Int32
	defer failpoint.Enable(failpoint.Init, func() error {
		// A refill's own hand-off (internal/pool) is background work, and
		// one can start as soon as an operation's foreground work ends.
		if !inOp.Load() || strings.Contains(string(debug.Stack()), "internal/pool.(*Pool)") {
			return nil
		}
		inits.Add(1)
		if release, ok := e.m.adm.TryAcquire(false); ok {
			release()
			idle.Add(1)
		}
		return nil
	})()
	op := func(name string, f func() error) {
		t.Helper()
		e.settle()
		inOp.Store(true)
		defer inOp.Store(false)
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	op("create from a snapshot", func() error {
		_, err := e.m.Create(context.Background(), sandbox.CreateRequest{TemplateID: sn.ID})
		return err
	})
	op("fork", func() error {
		_, err := e.m.Fork(context.Background(), p.ID, 2, 0)
		return err
	})
	op("create from the pool", func() error {
		_, err := e.m.Create(context.Background(), sandbox.CreateRequest{TemplateID: "base"})
		return err
	})
	if n := inits.Load(); n < 4 {
		t.Fatalf("%d hand-offs seen, want at least 4 (a create from a snapshot, two fork children, a pool hit)", n)
	}
	if n := idle.Load(); n != 0 {
		t.Errorf("%d of %d hand-offs ran while a background refill could take a start slot", n, inits.Load())
	}
}
