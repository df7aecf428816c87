package manager

import (
	"context"
	"testing"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// The pool's boxes (shells, ready boxes, standbys) run at the background
// CPU weight, so that refills take only what running sandboxes leave of
// the CPUs; every path that gives a box to a sandbox raises it.
func TestPoolBoxesRunInBackground(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.PoolReady, c.PoolShells, c.StandbySnapshots = 1, 2, 1 })
	ctx := context.Background()
	// check says which runtimes run in the background: the pool's, and
	// no sandbox's; and that no sandbox's image was restored in the
	// background unless the pool restored it before a sandbox took it (a
	// ready box, a standby): pooledBefore.
	pooledBefore := map[string]bool{}
	check := func(after string) {
		t.Helper()
		e.settle()
		owned := map[string]string{}
		list, err := e.m.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range list {
			owned[sb.RuntimeID] = sb.ID
		}
		ids, _ := e.h.List(ctx)
		pooled := 0
		for _, rid := range ids {
			id, ok := owned[rid]
			bg, restored := e.h.Background(rid)
			switch {
			case ok && bg:
				t.Errorf("after %s: sandbox %s runs in the background", after, id)
			case ok && restored && !pooledBefore[rid]:
				t.Errorf("after %s: sandbox %s was restored in the background", after, id)
			case !ok && !bg:
				t.Errorf("after %s: the pool's runtime %s runs in the foreground", after, rid)
			case !ok:
				pooled++
			}
		}
		for _, rid := range ids {
			// A shell ("created") has no image yet: one restored into it
			// for a sandbox is not the pool's.
			if st, _ := e.h.State(ctx, rid); owned[rid] == "" && st != "created" {
				pooledBefore[rid] = true
			}
		}
		if pooled == 0 {
			t.Errorf("after %s: the pool holds nothing", after)
		}
	}
	check("the first fill")
	p := e.create(sandbox.CreateRequest{}) // a pool hit
	check("a create from the pool")
	sn, err := e.m.Snapshot(ctx, p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	check("a snapshot (its standby filled)")
	e.create(sandbox.CreateRequest{TemplateID: sn.ID}) // the standby's
	check("a create from a snapshot's standby")
	e.create(sandbox.CreateRequest{TemplateID: sn.ID}) // into a shell
	check("a create from a snapshot")
	if _, err := e.m.Fork(ctx, p.ID, 2, 0); err != nil {
		t.Fatal(err)
	}
	check("a fork")
	if _, err := e.m.Rollback(ctx, p.ID, sn.ID); err != nil {
		t.Fatal(err)
	}
	check("a rollback")
	if err := e.m.Pause(ctx, p.ID, sandbox.PauseRequest{Spill: true}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.m.Connect(ctx, p.ID, sandbox.ConnectRequest{}); err != nil {
		t.Fatal(err)
	}
	check("a resume from disk")
}
