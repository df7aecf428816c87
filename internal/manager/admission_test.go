package manager

import (
	"context"
	"testing"

	"github.com/cellfork/cellfork/internal/failpoint"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// The hand-off (POST /init) of a restored box is foreground work: no pool
// refill may start beside it. The admission slot of the restore is given
// back when the box runs, and a refill started then (a shell's `runsc
// create`) took the CPUs from the new sandbox's /init.
func TestHandOffIsForeground(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.PoolReady, c.PoolShells = 1, 1 })
	e.settle()
	p := e.create(sandbox.CreateRequest{})
	sn, err := e.m.Snapshot(context.Background(), p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	e.settle()
	var inits, idle int
	defer failpoint.Enable(failpoint.Init, func() error {
		inits++
		if release, ok := e.m.adm.TryAcquire(false); ok {
			release()
			idle++
		}
		return nil
	})()
	if _, err := e.m.Create(context.Background(), sandbox.CreateRequest{TemplateID: sn.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Fork(context.Background(), p.ID, 2, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(context.Background(), sandbox.CreateRequest{TemplateID: "base"}); err != nil {
		t.Fatal(err)
	}
	if inits < 4 {
		t.Fatalf("%d hand-offs seen, want at least 4 (a create from a snapshot, two fork children, a pool hit)", inits)
	}
	if idle != 0 {
		t.Errorf("%d of %d hand-offs ran while a background refill could take a start slot", idle, inits)
	}
}
