package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/pool"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// Rollback restores the sandbox in place to a snapshot of its tree: same
// id, same address, the snapshot's state. The new state is started before
// the old one is dropped, so a failed rollback leaves the sandbox as it was.
func (m *Manager) Rollback(ctx context.Context, id, snapshot string) (*sandbox.Sandbox, error) {
	defer m.adm.Busy()()
	sn, err := m.snaps.Source(ctx, snapshot)
	if err != nil {
		return nil, err
	}
	release, err := m.snaps.Hold(ctx, sn)
	if err != nil {
		return nil, err
	}
	defer release()
	l, err := m.begin(ctx, id, "rolling it back", running)
	if err != nil {
		return nil, err
	}
	defer l.op.Unlock()
	ok, err := m.snaps.InTree(ctx, l.rec.ID, l.rec.BaseSnapshot, sn)
	if err != nil {
		return nil, err
	}
	if !ok || sn.Rootfs != l.rec.Rootfs {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "snapshot %q is not in the snapshot tree of sandbox %q", snapshot, id)
	}
	lim := m.limits(l.rec)
	if err := frozenFits("snapshot "+sn.ID, sn.Limits(), lim); err != nil {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "cannot roll sandbox %q back: %v", id, err)
	}
	nb, err := m.restoreOrStandby(ctx, sn, lim)
	if err != nil {
		return nil, fmt.Errorf("rolling back sandbox %s: %w", id, err)
	}
	cu := cleanup.Make(func() { m.boxes.Destroy(context.WithoutCancel(ctx), nb) })
	defer cu.Clean()
	old, err := m.swapBox(ctx, l, nb, func() { l.rec.BaseSnapshot = sn.ID })
	if err != nil {
		return nil, fmt.Errorf("rolling back sandbox %s: %w", id, err)
	}
	cu.Release()
	// Off the critical path, and after the client's next request: a
	// destroy costs CPU that request would wait for.
	m.boxes.DestroyLater(old, pool.IdleGrace)
	if sn.Image != "" {
		m.pool.UseStandby(sn.ID, sn.Image, sn.Rootfs, lim)
	}
	m.log.Info("sandbox rolled back", "sandbox.id", id, "snapshot.id", sn.ID)
	return l.record(), nil
}

// restoreOrStandby gets a running box of sn's state: its standby if it has
// one for lim, else a restore.
func (m *Manager) restoreOrStandby(ctx context.Context, sn *sandbox.Snapshot, lim sandbox.Limits) (*box.Box, error) {
	if b := m.pool.ResumeStandby(ctx, sn.ID, lim); b != nil {
		return b, nil
	}
	release, err := m.adm.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	dir, done, err := m.snaps.Image(ctx, sn)
	if err != nil {
		return nil, err
	}
	defer done()
	return m.pool.Restore(ctx, dir, sn.Rootfs, lim, m.cfg.DefaultLimits.Over(sn.Limits()))
}

// swapBox hands nb to the sandbox of l in place of its box, with change
// applied to its record, and returns the old box for the caller to
// destroy. On failure l is as it was and nb is the caller's. Caller holds
// l.op.
func (m *Manager) swapBox(ctx context.Context, l *Live, nb *box.Box, change func()) (*box.Box, error) {
	if err := m.boxes.HandOff(ctx, nb, m.handOff(l.rec)); err != nil {
		return nil, err
	}
	old, prev := l.box, *l.rec
	l.update(func() {
		l.box, l.rec.RuntimeID = nb, nb.RID
		change()
	})
	if err := m.put(ctx, l.rec); err != nil {
		l.update(func() { l.box, *l.rec = old, prev })
		return nil, err
	}
	m.watchBox(l, nb)
	return old, nil
}

// Fork makes n independent copies of the running sandbox at one instant
// (one checkpoint, n parallel restores); the parent keeps running. A
// failed child does not fail the others.
func (m *Manager) Fork(ctx context.Context, id string, n int, timeout time.Duration) ([]sandbox.ForkResult, error) {
	if n < 1 || n > m.cfg.MaxFork {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "count must be between 1 and %d", m.cfg.MaxFork)
	}
	if timeout == 0 {
		timeout = m.cfg.DefaultTimeout
	}
	if err := m.checkTimeout(timeout, false); err != nil {
		return nil, err
	}
	l, err := m.begin(ctx, id, "forking it", running)
	if err != nil {
		return nil, err
	}
	img := filepath.Join(m.forkDir(), sandbox.RandomHex(8))
	err = m.checkpoint(ctx, l, img)
	// The children's processes keep the limits the parent's were given.
	parent, limits, frozen := cloneRecord(l.rec), l.box.Limits(), l.box.Rlimits()
	l.op.Unlock()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(img)
	// Foreground until every child is handed off (see Create).
	defer m.adm.Busy()()
	t0 := time.Now()
	results := make([]sandbox.ForkResult, n)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			results[i].Sandbox, results[i].Err = m.forkChild(ctx, parent, img, limits, frozen, timeout)
		})
	}
	wg.Wait()
	timing.Since(ctx, "children", t0)
	return results, nil
}

func (m *Manager) forkChild(ctx context.Context, parent *sandbox.Sandbox, img string, limits, frozen sandbox.Limits, timeout time.Duration) (*sandbox.Sandbox, error) {
	release, err := m.adm.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	b, err := m.pool.Restore(ctx, img, parent.Rootfs, limits, frozen)
	release()
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	rec := cloneRecord(parent)
	rec.ID, rec.RuntimeID, rec.BootMode = m.ids.SandboxID(), b.RID, "fork"
	rec.AccessToken = m.ids.Token(rec.ID)
	rec.ParentID, rec.StartedAt, rec.EndAt, rec.PausedImage = parent.ID, now, now.Add(timeout), ""
	rec.State = sandbox.StateRunning
	return m.adopt(ctx, rec, b)
}

// Merge makes a fork child's state the parent's, under the parent's id and
// address; the child's id goes away and the parent's old state is dropped.
// Other children are untouched.
func (m *Manager) Merge(ctx context.Context, parentID, childID string) (*sandbox.Sandbox, error) {
	if parentID == childID {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "cannot merge a sandbox into itself")
	}
	// Both sandboxes' ops, in id order (lock order: see Manager).
	first, second := parentID, childID
	if second < first {
		first, second = second, first
	}
	a, err := m.begin(ctx, first, "merging it", running)
	if err != nil {
		return nil, m.mergeRefusal(err, parentID, childID)
	}
	defer a.op.Unlock()
	b, err := m.begin(ctx, second, "merging it", running)
	if err != nil {
		return nil, m.mergeRefusal(err, parentID, childID)
	}
	defer b.op.Unlock()
	p, c := a, b
	if p.rec.ID != parentID {
		p, c = b, a
	}
	if c.rec.ParentID != parentID {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is not a fork child of %q", childID, parentID)
	}
	cb := c.box
	// On failure the child keeps its box: it gets its own identity back.
	cu := cleanup.Make(func() { _ = m.boxes.HandOff(context.WithoutCancel(ctx), cb, m.handOff(c.rec)) })
	defer cu.Clean()
	old, err := m.swapBox(ctx, p, cb, func() { p.rec.BaseSnapshot = c.rec.BaseSnapshot })
	if err != nil {
		return nil, err
	}
	cu.Release()
	c.update(func() { c.box = nil }) // the parent's now
	m.forget(c)
	if err := m.st.Delete(ctx, childID); err != nil {
		m.log.Warn("deleting merged child record", "sandbox.id", childID, "err", err)
	}
	m.boxes.DestroyLater(old, 0)
	m.log.Info("sandbox merged", "sandbox.id", parentID, "child", childID)
	return p.record(), nil
}

// Assume merges a fork child of this host with its parent, which lives on
// another host of the cluster: the cluster moved the parent's row here
// (a gateway's merge across hosts), and the parent's id, token and
// settings now name the child's box, as after a merge on one host; the
// child's id goes away. The parent's old host drops its copy once it sees
// its row moved on. No bytes move.
func (m *Manager) Assume(ctx context.Context, childID, parentID string) (*sandbox.Sandbox, error) {
	if parentID == childID {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "cannot merge a sandbox into itself")
	}
	if m.cluster == nil {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "merging across hosts needs a cluster")
	}
	if m.exists(parentID) {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is on this host already: merge it here", parentID)
	}
	c, err := m.begin(ctx, childID, "merging it", running)
	if err != nil {
		return nil, m.mergeRefusal(err, parentID, childID)
	}
	defer c.op.Unlock()
	if c.rec.ParentID != parentID {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is not a fork child of %q", childID, parentID)
	}
	parent, err := m.cluster.MovedHere(ctx, parentID)
	if err != nil {
		return nil, err
	}
	if parent.Team != c.rec.Team || parent.State != sandbox.StateRunning {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is not a running sandbox of the child's team", parentID)
	}
	cb := c.box
	rec := cloneRecord(parent)
	rec.RuntimeID, rec.Rootfs, rec.BaseSnapshot = cb.RID, c.rec.Rootfs, ""
	rec.PausedImage, rec.PausedRoot = "", ""
	// On failure the child keeps its box: it gets its own identity back.
	cu := cleanup.Make(func() { _ = m.boxes.HandOff(context.WithoutCancel(ctx), cb, m.handOff(c.rec)) })
	defer cu.Clean()
	if err := m.boxes.HandOff(ctx, cb, m.handOff(rec)); err != nil {
		return nil, err
	}
	if err := m.put(ctx, rec); err != nil {
		return nil, err
	}
	cu.Release()
	c.update(func() { c.box = nil }) // the parent's now
	m.forget(c)
	m.register(newLive(rec, cb))
	if err := m.st.Delete(ctx, childID); err != nil {
		m.log.Warn("deleting merged child record", "sandbox.id", childID, "err", err)
	}
	m.log.Info("sandbox merged across hosts", "sandbox.id", parentID, "child", childID)
	return cloneRecord(rec), nil
}

// mergeRefusal words a refusal of one of merge's sandboxes.
func (m *Manager) mergeRefusal(err error, parentID, childID string) error {
	if !errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.New(errdefs.ErrFailedPrecondition, "both sandboxes must be running to merge (%s into %s)", childID, parentID)
	}
	return err
}
