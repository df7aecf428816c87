package manager

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/failpoint"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Every step of a create that can fail leaves nothing behind, whichever way
// the box came (pool, restore, boot).
func TestCreateFailureLeavesNothing(t *testing.T) {
	for _, pooled := range []bool{false, true} {
		for _, fp := range []string{failpoint.Netns, failpoint.Restore, failpoint.Init, failpoint.StorePut} {
			name := fp
			if pooled {
				name += "/pool"
			}
			t.Run(name, func(t *testing.T) {
				e := newEnv(t, func(c *Config) {
					if pooled {
						c.PoolReady, c.PoolShells = 1, 1
					}
				})
				if pooled {
					e.settle()
				}
				before := e.runtimes()
				disable := failpoint.Enable(fp, func() error { return errInjected })
				_, err := e.m.Create(context.Background(), sandbox.CreateRequest{TemplateID: "base"})
				disable()
				if !errors.Is(err, errInjected) {
					if pooled && (fp == failpoint.Netns || fp == failpoint.Restore) && err == nil {
						return // the pool's box needed neither
					}
					t.Fatalf("create with %s failing: %v", fp, err)
				}
				if list, _ := e.m.List(context.Background()); len(list) != 0 {
					t.Errorf("a failed create left sandboxes: %v", list)
				}
				recs, _ := e.st.List(context.Background())
				if len(recs) != 0 {
					t.Errorf("a failed create left records: %d", len(recs))
				}
				if !pooled && e.runtimes() != before {
					t.Errorf("runtimes %d -> %d after a failed create", before, e.runtimes())
				}
				e.create(sandbox.CreateRequest{}) // and the next one works
			})
		}
	}
}

// A fork whose one child fails gives the others, and an error for that one.
func TestForkOneChildFails(t *testing.T) {
	e := newEnv(t, nil)
	p := e.create(sandbox.CreateRequest{})
	e.write(p.ID, "parent-state")
	defer failpoint.Enable(failpoint.Restore, failpoint.After(2, errInjected))()
	res, err := e.m.Fork(context.Background(), p.ID, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ok, failed int
	for _, r := range res {
		switch {
		case r.Err != nil && errors.Is(r.Err, errInjected):
			failed++
		case r.Err == nil:
			ok++
			if got := e.memory(r.Sandbox.ID); got != "parent-state" {
				t.Errorf("child memory %q", got)
			}
			inits := e.h.Inits(r.Sandbox.RuntimeID)
			if len(inits) == 0 || inits[len(inits)-1].EnvVars["E2B_SANDBOX_ID"] != r.Sandbox.ID {
				t.Errorf("child %s was not handed its own identity: %+v", r.Sandbox.ID, inits)
			}
		default:
			t.Errorf("child error %v", r.Err)
		}
	}
	if ok != 2 || failed != 1 {
		t.Fatalf("ok %d failed %d", ok, failed)
	}
	if got := e.memory(p.ID); got != "parent-state" {
		t.Errorf("parent memory %q after the fork", got)
	}
	if list, _ := e.m.List(context.Background()); len(list) != 3 {
		t.Errorf("%d sandboxes, want the parent and 2 children", len(list))
	}
}

// A rollback that fails at any step leaves the sandbox as it was; one that
// succeeds has the snapshot's state under the same id.
func TestRollbackFailsHalfway(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(sandbox.CreateRequest{})
	e.write(sb.ID, "a")
	sn, err := e.m.Snapshot(context.Background(), sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	e.write(sb.ID, "b")
	rid := e.mustGet(sb.ID).RuntimeID
	for _, fp := range []string{failpoint.Restore, failpoint.Init, failpoint.StorePut} {
		before := e.runtimes()
		disable := failpoint.Enable(fp, func() error { return errInjected })
		_, err := e.m.Rollback(context.Background(), sb.ID, sn.ID)
		disable()
		if !errors.Is(err, errInjected) {
			t.Fatalf("rollback with %s failing: %v", fp, err)
		}
		if got := e.mustGet(sb.ID); got.RuntimeID != rid || got.BaseSnapshot != sn.ID || got.State != sandbox.StateRunning {
			t.Errorf("%s: sandbox changed: %+v", fp, got)
		}
		if e.memory(sb.ID) != "b" || e.runtimes() != before {
			t.Errorf("%s: memory %q, runtimes %d -> %d", fp, e.memory(sb.ID), before, e.runtimes())
		}
		if rec, _ := e.st.Get(context.Background(), sb.ID); rec.RuntimeID != rid {
			t.Errorf("%s: the stored record moved to %s", fp, rec.RuntimeID)
		}
	}
	got, err := e.m.Rollback(context.Background(), sb.ID, sn.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != sb.ID || got.RuntimeID == rid || e.memory(sb.ID) != "a" {
		t.Errorf("after rollback: %+v, memory %q", got, e.memory(sb.ID))
	}
}

func (e *env) mustGet(id string) *sandbox.Sandbox {
	e.t.Helper()
	sb, err := e.m.Get(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return sb
}

// Merge makes the child's state the parent's; a merge that fails leaves
// both as they were, the child with its own identity.
func TestMerge(t *testing.T) {
	e := newEnv(t, nil)
	p := e.create(sandbox.CreateRequest{})
	res, err := e.m.Fork(context.Background(), p.ID, 1, 0)
	if err != nil || res[0].Err != nil {
		t.Fatal(err, res)
	}
	c := res[0].Sandbox
	e.write(c.ID, "child-work")
	prid := e.mustGet(p.ID).RuntimeID

	e.failEach([]string{failpoint.Init, failpoint.StorePut}, func() error {
		_, err := e.m.Merge(context.Background(), p.ID, c.ID)
		return err
	}, p.ID, c.ID)
	if e.mustGet(p.ID).RuntimeID != prid || e.memory(c.ID) != "child-work" {
		t.Error("a failed merge changed the sandboxes")
	}
	inits := e.h.Inits(c.RuntimeID)
	if last := inits[len(inits)-1]; last.EnvVars["E2B_SANDBOX_ID"] != c.ID {
		t.Errorf("after a failed merge the child's agent says it is %s", last.EnvVars["E2B_SANDBOX_ID"])
	}

	if _, err := e.m.Merge(context.Background(), p.ID, p.ID); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("merge into itself: %v", err)
	}
	other := e.create(sandbox.CreateRequest{})
	if _, err := e.m.Merge(context.Background(), p.ID, other.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("merge of a non-child: %v", err)
	}
	got, err := e.m.Merge(context.Background(), p.ID, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != p.ID || got.RuntimeID != c.RuntimeID || e.memory(p.ID) != "child-work" {
		t.Errorf("after merge: %+v memory %q", got, e.memory(p.ID))
	}
	if _, err := e.m.Get(context.Background(), c.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the merged child is still there: %v", err)
	}
	inits = e.h.Inits(c.RuntimeID)
	if last := inits[len(inits)-1]; last.EnvVars["E2B_SANDBOX_ID"] != p.ID {
		t.Errorf("the merged box's agent says it is %s", last.EnvVars["E2B_SANDBOX_ID"])
	}
}

// Pause and resume survive a daemon restart, from memory and from disk; a
// failed resume leaves the sandbox paused.
func TestPauseResumeAcrossRestart(t *testing.T) {
	e := newEnv(t, nil)
	frozenSB := e.create(sandbox.CreateRequest{})
	e.write(frozenSB.ID, "in-memory")
	diskSB := e.create(sandbox.CreateRequest{})
	e.write(diskSB.ID, "on-disk")
	ctx := context.Background()
	if err := e.m.Pause(ctx, frozenSB.ID, sandbox.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Pause(ctx, diskSB.ID, sandbox.PauseRequest{Spill: true}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Pause(ctx, frozenSB.ID, sandbox.PauseRequest{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("pausing a paused sandbox: %v", err)
	}
	e.restart()
	for _, id := range []string{frozenSB.ID, diskSB.ID} {
		if st := e.mustGet(id).State; st != sandbox.StatePaused {
			t.Errorf("%s is %s after the restart", id, st)
		}
	}
	// A resume from disk that fails leaves it paused on disk.
	disable := failpoint.Enable(failpoint.Init, func() error { return errInjected })
	_, _, err := e.m.Connect(ctx, diskSB.ID, sandbox.ConnectRequest{})
	disable()
	if !errors.Is(err, errInjected) {
		t.Fatalf("connect with init failing: %v", err)
	}
	if got := e.mustGet(diskSB.ID); got.State != sandbox.StatePaused || got.PausedImage == "" {
		t.Errorf("after a failed resume: %+v", got)
	}
	// So does a resume from memory.
	disable = failpoint.Enable(failpoint.StorePut, func() error { return errInjected })
	_, _, err = e.m.Connect(ctx, frozenSB.ID, sandbox.ConnectRequest{})
	disable()
	if !errors.Is(err, errInjected) {
		t.Fatalf("connect with the store failing: %v", err)
	}
	if st, _ := e.h.State(ctx, e.mustGet(frozenSB.ID).RuntimeID); st != "paused" {
		t.Errorf("a failed resume from memory left its box %s", st)
	}
	for id, want := range map[string]string{frozenSB.ID: "in-memory", diskSB.ID: "on-disk"} {
		sb, resumed, err := e.m.Connect(ctx, id, sandbox.ConnectRequest{Timeout: 30 * time.Second})
		if err != nil || !resumed || sb.State != sandbox.StateRunning {
			t.Fatalf("connect %s: %v %v %+v", id, resumed, err, sb)
		}
		if got := e.memory(id); got != want {
			t.Errorf("%s resumed with %q, want %q", id, got, want)
		}
		if _, resumed, err := e.m.Connect(ctx, id, sandbox.ConnectRequest{}); err != nil || resumed {
			t.Errorf("connect to a running sandbox: resumed %v, %v", resumed, err)
		}
		if _, _, err := e.m.Connect(ctx, id, sandbox.ConnectRequest{MustBePaused: true}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("v1 resume of a running sandbox: %v", err)
		}
	}
}

// A box that dies on its own takes its sandbox with it, and the sandbox's
// id then says why.
func TestBoxDeath(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(sandbox.CreateRequest{})
	e.h.Crash(sb.RuntimeID)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := e.m.Get(context.Background(), sb.ID)
		if errors.Is(err, errdefs.ErrNotFound) {
			if msg := errdefs.UserMessage(err); !strings.Contains(msg, "died") {
				t.Errorf("message %q", msg)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead sandbox is still listed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for recs, _ := e.st.List(context.Background()); len(recs) != 0; recs, _ = e.st.List(context.Background()) {
		if time.Now().After(deadline) {
			t.Fatal("its record stayed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SetTimeout(0) expires the sandbox now (E2B's minimum is 0).
func TestTimeoutZeroExpiresNow(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(sandbox.CreateRequest{})
	if err := e.m.SetTimeout(context.Background(), sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := e.m.Get(context.Background(), sb.ID); errors.Is(err, errdefs.ErrNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox outlived a zero timeout")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Metrics are history: a range from before the sandbox existed has none,
// the default range has at least the sample taken now.
func TestMetricsRange(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(sandbox.CreateRequest{})
	ctx := context.Background()
	ms, err := e.m.Metrics(ctx, sb.ID, time.Time{}, time.Time{})
	if err != nil || len(ms) == 0 || ms[0].MemUsed == 0 {
		t.Fatalf("default range: %+v, %v", ms, err)
	}
	before := sb.StartedAt.Add(-time.Hour)
	if ms, err := e.m.Metrics(ctx, sb.ID, before, before.Add(30*time.Minute)); err != nil || len(ms) != 0 {
		t.Errorf("a range before the sandbox: %+v, %v", ms, err)
	}
	ms2, _ := e.m.Metrics(ctx, sb.ID, time.Time{}, time.Time{})
	if len(ms2) != len(ms) {
		t.Errorf("a second call right away took another sample: %d then %d", len(ms), len(ms2))
	}
}

// A filesystem-only pause keeps the files and drops the memory: connect
// boots the sandbox afresh from them; traffic never does. A memory pause
// can be resumed the same way (E2B's memory false on connect).
func TestPauseFilesOnly(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb := e.create(sandbox.CreateRequest{AutoResume: true, OnTimeout: "pause"})
	e.write(sb.ID, "files-and-memory")
	if err := e.m.Pause(ctx, sb.ID, sandbox.PauseRequest{FilesOnly: true}); err != nil {
		t.Fatal(err)
	}
	got := e.mustGet(sb.ID)
	if got.State != sandbox.StatePaused || got.PauseMode != sandbox.PauseFiles {
		t.Fatalf("after a filesystem-only pause: %+v", got)
	}
	e.settle()
	if e.h.Memory(sb.RuntimeID) != "" {
		t.Error("its box survived the pause")
	}
	if _, err := e.m.Endpoint(ctx, sb.ID, func(*sandbox.Sandbox) bool { return true }); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("traffic woke a sandbox paused without memory: %v", err)
	}
	e.restart() // it survives a restart too
	if _, resumed, err := e.m.Connect(ctx, sb.ID, sandbox.ConnectRequest{}); err != nil || !resumed {
		t.Fatalf("connect: %v %v", resumed, err)
	}
	if got := e.memory(sb.ID); got != "boot+files-and-memory" {
		t.Errorf("resumed with %q: not booted afresh from its files", got)
	}
	if got := e.mustGet(sb.ID); got.PauseMode != "" || got.PausedImage != "" {
		t.Errorf("running with %+v", got)
	}

	// A memory pause resumed by a reboot, from memory and from disk.
	for _, spill := range []bool{false, true} {
		e.write(sb.ID, "again")
		if err := e.m.Pause(ctx, sb.ID, sandbox.PauseRequest{Spill: spill}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.m.Connect(ctx, sb.ID, sandbox.ConnectRequest{Reboot: true}); err != nil {
			t.Fatal(err)
		}
		if got := e.memory(sb.ID); got != "boot+again" {
			t.Errorf("spill %v: rebooted with %q", spill, got)
		}
	}
	// A reboot that fails leaves it paused, its files kept.
	if err := e.m.Pause(ctx, sb.ID, sandbox.PauseRequest{FilesOnly: true}); err != nil {
		t.Fatal(err)
	}
	e.h.Fail("Start", errInjected)
	_, _, err := e.m.Connect(ctx, sb.ID, sandbox.ConnectRequest{})
	e.h.Fail("Start", nil)
	if !errors.Is(err, errInjected) {
		t.Fatalf("connect with boots failing: %v", err)
	}
	if got := e.mustGet(sb.ID); got.State != sandbox.StatePaused || got.PauseMode != sandbox.PauseFiles || !fileExists(filepath.Join(got.PausedImage, upperTar)) {
		t.Errorf("after a failed reboot: %+v", got)
	}
	// An agent that does not answer: no filesystem-only pause.
	if _, _, err := e.m.Connect(ctx, sb.ID, sandbox.ConnectRequest{}); err != nil {
		t.Fatal(err)
	}
	e.h.Fail("Health", errInjected)
	err = e.m.Pause(ctx, sb.ID, sandbox.PauseRequest{FilesOnly: true})
	e.h.Fail("Health", nil)
	if !errors.Is(err, errdefs.ErrUnavailable) || e.mustGet(sb.ID).State != sandbox.StateRunning {
		t.Errorf("filesystem-only pause with the agent silent: %v", err)
	}
	if _, err := e.m.Create(ctx, sandbox.CreateRequest{TemplateID: "base", OnTimeout: "pause", AutoResume: true, AutoPauseFiles: true}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("autoResume with autoPauseMemory false: %v", err)
	}
}

// clusterIDs mints ids a test can recognise, as a cluster host does.
type clusterIDs struct{ sandbox.RandomIDs }

func (clusterIDs) Own(id string) bool { return strings.HasPrefix(id, "own") }

// A team sees only its own sandboxes and snapshots; a create under a
// minted id is idempotent; ids not this host's are refused.
func TestTeamsAndMintedIDs(t *testing.T) {
	e := newEnv(t, nil)
	e.m.ids = clusterIDs{}
	a := sandbox.WithTeam(context.Background(), "team-a")
	b := sandbox.WithTeam(context.Background(), "team-b")
	sb, err := e.m.Create(a, sandbox.CreateRequest{ID: "own00000000000000001", TemplateID: "base"})
	if err != nil || sb.ID != "own00000000000000001" || sb.Team != "team-a" {
		t.Fatalf("create with a minted id: %+v, %v", sb, err)
	}
	again, err := e.m.Create(a, sandbox.CreateRequest{ID: sb.ID, TemplateID: "base"})
	if err != nil || again.RuntimeID != sb.RuntimeID {
		t.Errorf("a retried create made another sandbox: %+v, %v", again, err)
	}
	if _, err := e.m.Create(b, sandbox.CreateRequest{ID: sb.ID, TemplateID: "base"}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("another team's create under a taken id: %v", err)
	}
	if _, err := e.m.Create(a, sandbox.CreateRequest{ID: "elsewhere00000000001", TemplateID: "base"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("an id not this host's: %v", err)
	}
	if _, err := e.m.Get(b, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("team b got team a's sandbox: %v", err)
	}
	if err := e.m.Kill(b, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("team b killed team a's sandbox: %v", err)
	}
	if list, _ := e.m.List(b); len(list) != 0 {
		t.Errorf("team b lists %d sandboxes", len(list))
	}
	if list, _ := e.m.List(a); len(list) != 1 {
		t.Errorf("team a lists %d sandboxes", len(list))
	}
	sn, err := e.m.Snapshot(a, sb.ID, "mine")
	if err != nil || sn.Team != "team-a" {
		t.Fatalf("snapshot: %+v, %v", sn, err)
	}
	if _, err := e.m.GetSnapshot(b, "mine"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("team b found team a's snapshot by name: %v", err)
	}
	if err := e.m.DeleteSnapshot(b, sn.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("team b deleted team a's snapshot: %v", err)
	}
	if _, err := e.m.Create(b, sandbox.CreateRequest{TemplateID: sn.ID}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("team b created from team a's snapshot: %v", err)
	}
	inits := e.h.Inits(sb.RuntimeID)
	if team := inits[len(inits)-1].EnvVars["E2B_TEAM_ID"]; team != "team-a" {
		t.Errorf("E2B_TEAM_ID = %q", team)
	}
}
