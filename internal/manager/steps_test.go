package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/failpoint"
	"github.com/cellfork/cellfork/internal/runtime/fake"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Each operation's steps fail in turn (failpoint.go's, and the fake
// machine's and the store's where no failpoint is): the operation returns
// the step's error, leaves the sandbox as it was, and leaves nothing
// behind (failure_test.go has create, fork's children, rollback, merge
// and resume after a restart).

// arm makes step fail with errInjected until the returned func is called:
// a failpoint's name, "fake:Op" (a method of the fake machine) or
// "store:Op" (a method of the env's store).
func (e *env) arm(step string) (disarm func()) {
	switch kind, op, _ := strings.Cut(step, ":"); kind {
	case "fake":
		e.h.Fail(op, errInjected)
		return func() { e.h.Fail(op, nil) }
	case "store":
		e.st.Fail(op, errInjected)
		return func() { e.st.Fail(op, nil) }
	}
	return failpoint.Enable(step, func() error { return errInjected })
}

// state is what a failed operation must leave as it was: the sandbox's
// record as callers and the store see it, its box's state and memory, the
// machine's runtimes, and the images in the data directory.
type state struct {
	Record, Stored *sandbox.Sandbox
	Box, Memory    string
	Runtimes       []string
	Images         []string
}

func (s state) String() string {
	return fmt.Sprintf("record %+v\nstored %+v\nbox %q memory %q runtimes %v images %v", *s.Record, *s.Stored, s.Box, s.Memory, s.Runtimes, s.Images)
}

func (e *env) state(id string) state {
	e.t.Helper()
	ctx := context.Background()
	rec := e.mustGet(id)
	stored, err := e.st.Get(ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	box, _ := e.h.State(ctx, rec.RuntimeID)
	runtimes, _ := e.h.List(ctx)
	var images []string
	for _, dir := range []string{"paused", "snapshots", "forks", "imports"} {
		entries, _ := os.ReadDir(filepath.Join(e.dir, dir))
		for _, en := range entries {
			images = append(images, dir+"/"+en.Name())
		}
	}
	return state{Record: rec, Stored: stored, Box: box, Memory: e.h.Memory(rec.RuntimeID), Runtimes: runtimes, Images: images}
}

// failEach runs op once with each step failing, and checks that it
// returns the step's error and leaves the sandboxes ids as they were.
func (e *env) failEach(steps []string, op func() error, ids ...string) {
	e.t.Helper()
	for _, step := range steps {
		var before []state
		for _, id := range ids {
			before = append(before, e.state(id))
		}
		disarm := e.arm(step)
		err := op()
		disarm()
		if !errors.Is(err, errInjected) {
			e.t.Errorf("with %s failing: %v, want the injected error", step, err)
		}
		for i, id := range ids {
			if after := e.state(id); !reflect.DeepEqual(after, before[i]) {
				e.t.Errorf("with %s failing, sandbox %s changed:\n%s\nwas\n%s", step, id, after, before[i])
			}
		}
	}
}

// A snapshot whose checkpoint or record fails leaves no snapshot, no image
// and the sandbox's base as it was.
func TestSnapshotFails(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb := e.create(sandbox.CreateRequest{})
	e.write(sb.ID, "state")
	e.failEach([]string{failpoint.Checkpoint, "fake:Checkpoint", "store:PutSnapshot"}, func() error {
		_, err := e.m.Snapshot(ctx, sb.ID, "named")
		return err
	}, sb.ID)
	if list, _ := e.m.ListSnapshots(ctx); len(list) != 0 {
		t.Errorf("failed snapshots were recorded: %v", list)
	}
	if _, err := e.m.Snapshot(ctx, sb.ID, "named"); err != nil {
		t.Fatal(err)
	}
}

// A fork whose checkpoint fails makes no child and leaves no image.
func TestForkCheckpointFails(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	p := e.create(sandbox.CreateRequest{})
	e.write(p.ID, "parent")
	e.failEach([]string{failpoint.Checkpoint, "fake:Checkpoint"}, func() error {
		_, err := e.m.Fork(ctx, p.ID, 2, 0)
		return err
	}, p.ID)
	if list, _ := e.m.List(ctx); len(list) != 1 {
		t.Errorf("%d sandboxes after failed forks, want the parent alone", len(list))
	}
}

// A pause (in memory, or of the files only) that fails at any step leaves
// the sandbox running, and it still expires when its time is up.
func TestPauseFails(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb := e.create(sandbox.CreateRequest{Timeout: 3 * time.Second})
	e.write(sb.ID, "running")
	e.failEach([]string{"fake:Pause", failpoint.StorePut}, func() error {
		return e.m.Pause(ctx, sb.ID, sandbox.PauseRequest{})
	}, sb.ID)
	e.failEach([]string{"fake:Pause", failpoint.Checkpoint, "fake:ExportRootfs", failpoint.StorePut}, func() error {
		return e.m.Pause(ctx, sb.ID, sandbox.PauseRequest{FilesOnly: true})
	}, sb.ID)
	e.waitGone(sb.ID, 10*time.Second)
}

// waitGone polls until sandbox id is gone.
func (e *env) waitGone(id string, within time.Duration) {
	e.t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		if _, err := e.m.Get(context.Background(), id); errors.Is(err, errdefs.ErrNotFound) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("sandbox %s still there after %v", id, within)
		}
	}
}

// A move to disk that fails leaves the sandbox frozen in memory, and its
// spill timer still moves it to disk later.
func TestSpillFails(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SpillAfter = 2 * time.Second })
	ctx := context.Background()
	sb := e.create(sandbox.CreateRequest{})
	e.write(sb.ID, "frozen")
	if err := e.m.Pause(ctx, sb.ID, sandbox.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
	e.failEach([]string{failpoint.Checkpoint, "fake:Checkpoint", failpoint.StorePut}, func() error {
		return e.m.Pause(ctx, sb.ID, sandbox.PauseRequest{Spill: true})
	}, sb.ID)
	for deadline := time.Now().Add(10 * time.Second); e.mustGet(sb.ID).PausedImage == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the frozen sandbox never moved to disk after a failed spill")
		}
	}
	if _, _, err := e.m.Connect(ctx, sb.ID, sandbox.ConnectRequest{}); err != nil || e.memory(sb.ID) != "frozen" {
		t.Fatalf("resume after the spill: %v, memory %q", err, e.memory(sb.ID))
	}
}

// A resume that fails at any step leaves the sandbox paused where it was:
// frozen in memory (its box frozen again), or on disk (its image kept, no
// box left).
func TestResumeFails(t *testing.T) {
	const ca = "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n"
	e := newEnv(t, func(c *Config) { c.EgressCA = []byte(ca) })
	ctx := context.Background()
	connect := func(id string) func() error {
		return func() error { _, _, err := e.m.Connect(ctx, id, sandbox.ConnectRequest{}); return err }
	}
	frozenSB := e.create(sandbox.CreateRequest{})
	e.write(frozenSB.ID, "in-memory")
	if err := e.m.Pause(ctx, frozenSB.ID, sandbox.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
	// Rules given while frozen: its resume tells the agent (an /init).
	withRules := sandbox.DefaultNetwork
	withRules.Rules = map[string]sandbox.Transform{"api.example.com": {Headers: map[string]string{"Authorization": "Bearer s"}}}
	if err := e.m.UpdateNetwork(ctx, frozenSB.ID, withRules); err != nil {
		t.Fatal(err)
	}
	e.failEach([]string{failpoint.Resume, "fake:Resume", "fake:Init", failpoint.StorePut}, connect(frozenSB.ID), frozenSB.ID)

	diskSB := e.create(sandbox.CreateRequest{})
	e.write(diskSB.ID, "on-disk")
	if err := e.m.Pause(ctx, diskSB.ID, sandbox.PauseRequest{Spill: true}); err != nil {
		t.Fatal(err)
	}
	e.settle() // its frozen box destroyed
	e.failEach([]string{failpoint.Netns, failpoint.Restore, failpoint.Init, failpoint.StorePut}, connect(diskSB.ID), diskSB.ID)

	for id, want := range map[string]string{frozenSB.ID: "in-memory", diskSB.ID: "on-disk"} {
		if _, _, err := e.m.Connect(ctx, id, sandbox.ConnectRequest{}); err != nil || e.memory(id) != want {
			t.Errorf("resume of %s: %v, memory %q", id, err, e.memory(id))
		}
	}
}

// A kill whose box cannot be destroyed, or whose record cannot be
// deleted, still makes the sandbox gone for callers (it is: it no longer
// serves), and the next start removes what it left.
func TestKillFails(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	for _, step := range []string{"fake:Destroy", "store:Delete"} {
		sb := e.create(sandbox.CreateRequest{})
		disarm := e.arm(step)
		err := e.m.Kill(ctx, sb.ID)
		disarm()
		if !errors.Is(err, errInjected) {
			t.Errorf("kill with %s failing: %v", step, err)
		}
		if _, err := e.m.Get(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("after a kill with %s failing: %v", step, err)
		}
	}
	e.restart()
	if list, _ := e.m.List(ctx); len(list) != 0 {
		t.Errorf("a restart adopted killed sandboxes: %v", list)
	}
	if recs, _ := e.st.List(ctx); len(recs) != 0 || len(e.h.Leaks()) != 0 {
		t.Errorf("after a restart: records %v, left %v", recs, e.h.Leaks())
	}
}

// A network update that fails at any step leaves the sandbox's policy as
// it was, on its record and on its box's network.
func TestUpdateNetworkFails(t *testing.T) {
	const ca = "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n"
	e := newEnv(t, func(c *Config) { c.EgressCA = []byte(ca) })
	ctx := context.Background()
	sb := e.create(sandbox.CreateRequest{})
	l, err := e.m.find(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	net := l.box.Net.(*fake.Net)
	before, _ := net.Policy()
	withRules := sandbox.DefaultNetwork
	withRules.AllowInternet = false
	withRules.Rules = map[string]sandbox.Transform{"api.example.com": {Headers: map[string]string{"Authorization": "Bearer s"}}}
	e.failEach([]string{"fake:Init", "fake:SetPolicy", failpoint.StorePut}, func() error {
		return e.m.UpdateNetwork(ctx, sb.ID, withRules)
	}, sb.ID)
	if after, _ := net.Policy(); !reflect.DeepEqual(after, before) {
		t.Errorf("the box's network policy changed: %+v, was %+v", after, before)
	}
	if err := e.m.UpdateNetwork(ctx, sb.ID, withRules); err != nil {
		t.Fatal(err)
	}
	if after, _ := net.Policy(); reflect.DeepEqual(after, before) {
		t.Error("a network update did not reach the box")
	}
}

// A timeout change whose record fails keeps the sandbox's end.
func TestSetTimeoutFails(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb := e.create(sandbox.CreateRequest{})
	e.failEach([]string{failpoint.StorePut}, func() error { return e.m.SetTimeout(ctx, sb.ID, time.Hour) }, sb.ID)
	e.failEach([]string{failpoint.StorePut}, func() error { return e.m.ExtendTimeout(ctx, sb.ID, time.Hour) }, sb.ID)
}

// A snapshot delete whose record fails keeps the snapshot, its image and
// the base of the sandbox it was taken of.
func TestDeleteSnapshotFails(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb := e.create(sandbox.CreateRequest{})
	sn, err := e.m.Snapshot(ctx, sb.ID, "kept")
	if err != nil {
		t.Fatal(err)
	}
	e.failEach([]string{"store:DeleteSnapshot"}, func() error { return e.m.DeleteSnapshot(ctx, "kept") }, sb.ID)
	if got, err := e.m.GetSnapshot(ctx, "kept"); err != nil || got.ID != sn.ID {
		t.Errorf("after a failed delete: %+v, %v", got, err)
	}
	if c, err := e.m.Create(ctx, sandbox.CreateRequest{TemplateID: "kept"}); err != nil || c.BaseSnapshot != sn.ID {
		t.Errorf("create from the snapshot a delete failed to remove: %+v, %v", c, err)
	}
}
