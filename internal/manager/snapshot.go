package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
	"github.com/cellfork/cellfork/internal/timing"
)

func (m *Manager) snapshotDir(id string) string { return filepath.Join(m.cfg.DataDir, "snapshots", id) }

// forkDir holds the images of forks in progress (Config.ForkDir).
func (m *Manager) forkDir() string {
	if m.cfg.ForkDir != "" {
		return m.cfg.ForkDir
	}
	return filepath.Join(m.cfg.DataDir, "forks")
}

var snapshotNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

// findSnapshot looks a snapshot up by id, then by name.
func (m *Manager) findSnapshot(ctx context.Context, idOrName string) (*sandbox.Snapshot, error) {
	if sn, err := m.st.GetSnapshot(ctx, idOrName); err == nil {
		return sn, nil
	}
	all, err := m.st.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, sn := range all {
		if slices.Contains(sn.Names, idOrName) {
			return sn, nil
		}
	}
	return nil, errdefs.New(errdefs.ErrNotFound, "snapshot %q not found", idOrName)
}

// SnapshotUsage returns the bytes snapshot images use and the cap (0 = none).
func (m *Manager) SnapshotUsage(ctx context.Context) (total, limit int64, count int, err error) {
	all, err := m.st.ListSnapshots(ctx)
	for _, sn := range all {
		total += sn.SizeBytes
	}
	return total, m.cfg.SnapshotCapBytes, len(all), err
}

// checkDiskRoom refuses a new image when snapshots reach the cap or the
// disk is nearly full.
func (m *Manager) checkDiskRoom(ctx context.Context) error {
	total, limit, _, err := m.SnapshotUsage(ctx)
	if err != nil {
		return err
	}
	if limit > 0 && total >= limit {
		return errdefs.New(errdefs.ErrResourceExhausted, "snapshot disk cap reached: %d MiB used of %d MiB; delete snapshots first", total>>20, limit>>20)
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(m.cfg.DataDir, &fs); err == nil && int64(fs.Bavail)*fs.Bsize < 1<<30 {
		return errdefs.New(errdefs.ErrResourceExhausted, "less than 1 GiB free on the data disk; delete snapshots first")
	}
	return nil
}

// checkName refuses names that are malformed or would be shadowed by a
// built-in template or a route. (A name in use is not refused: it moves to
// the new snapshot, see recordSnapshot.)
func checkName(name string) error {
	if name == "" {
		return nil
	}
	if !snapshotNameRE.MatchString(name) {
		return errdefs.New(errdefs.ErrInvalidArgument, "snapshot name must be 1-128 characters of letters, digits and ._:/-")
	}
	if _, err := template.Resolve(name); err == nil || name == "usage" {
		return errdefs.New(errdefs.ErrInvalidArgument, "snapshot name %q is reserved", name)
	}
	return nil
}

// Snapshot saves the sandbox's whole state (memory, processes, files,
// sockets) as a new snapshot; the sandbox keeps running.
func (m *Manager) Snapshot(ctx context.Context, id, name string) (*sandbox.Snapshot, error) {
	l, err := m.locked(id)
	if err != nil {
		return nil, err
	}
	defer l.mu.Unlock()
	if l.rec.State != sandbox.StateRunning {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is paused: resume it before taking a snapshot", id)
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := m.checkDiskRoom(ctx); err != nil {
		return nil, err
	}
	sid := "snap" + newID()[:16]
	dir := m.snapshotDir(sid)
	if err := m.checkpointInto(ctx, l.box.rid, dir, true); err != nil {
		return nil, err
	}
	sn := &sandbox.Snapshot{
		ID: sid, Names: []string{}, ParentID: l.rec.BaseSnapshot, SandboxID: id, TemplateID: l.rec.TemplateID,
		Rootfs: l.rec.Rootfs, Image: dir, SizeBytes: imageSize(dir), CreatedAt: time.Now().UTC(),
		Envs: maps.Clone(l.rec.Envs), Network: cloneNetwork(l.rec.Network),
	}
	lim := m.limits(l.rec)
	sn.CPUCount, sn.MemoryMB, sn.DiskMB, sn.PidsMax, sn.OpenFiles = lim.CPUCount, lim.MemoryMB, lim.DiskMB, lim.PidsMax, lim.OpenFiles
	if name != "" {
		sn.Names = []string{name}
	}
	if err := m.recordSnapshot(ctx, sn); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	l.rec.BaseSnapshot = sid
	if err := m.st.Put(ctx, l.rec); err != nil {
		m.log.Warn("recording snapshot base", "sandbox.id", id, "err", err)
	}
	m.log.Info("snapshot taken", "sandbox.id", id, "snapshot.id", sid, "bytes", sn.SizeBytes)
	return sn, nil
}

// recordSnapshot stores a new snapshot under the lock that deletes take. A
// name moves to the newest snapshot that takes it (as E2B's named
// snapshots do: the older one stays, reachable by id); a parent deleted
// meanwhile is dropped.
func (m *Manager) recordSnapshot(ctx context.Context, sn *sandbox.Snapshot) error {
	m.snap.Lock()
	defer m.snap.Unlock()
	if len(sn.Names) > 0 {
		if old, err := m.findSnapshot(ctx, sn.Names[0]); err == nil {
			old.Names = slices.DeleteFunc(old.Names, func(n string) bool { return n == sn.Names[0] })
			if err := m.st.PutSnapshot(ctx, old); err != nil {
				return err
			}
		}
	}
	if sn.ParentID != "" {
		if _, err := m.st.GetSnapshot(ctx, sn.ParentID); err != nil {
			sn.ParentID = ""
		}
	}
	return m.st.PutSnapshot(ctx, sn)
}

// ListSnapshots returns every snapshot, oldest first.
func (m *Manager) ListSnapshots(ctx context.Context) ([]*sandbox.Snapshot, error) {
	all, err := m.st.ListSnapshots(ctx)
	slices.SortFunc(all, func(a, b *sandbox.Snapshot) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return all, err
}

// GetSnapshot returns one snapshot by id or name.
func (m *Manager) GetSnapshot(ctx context.Context, idOrName string) (*sandbox.Snapshot, error) {
	return m.findSnapshot(ctx, idOrName)
}

// DeleteSnapshot removes a snapshot and, once no restore reads it, its
// image. Its children in the tree move up to its parent, and so do the
// sandboxes based on it.
//
// The tree is rewritten under snap; the sandboxes are re-based after snap
// is released, each under its own mu (lock order: Live.mu before snap, see
// Manager). A snapshot being taken of a sandbox meanwhile holds that
// sandbox's mu until its base is recorded, so the re-base sees it.
func (m *Manager) DeleteSnapshot(ctx context.Context, idOrName string) error {
	sn, err := m.unrecordSnapshot(ctx, idOrName)
	if err != nil {
		return err
	}
	m.mu.Lock()
	lives := slices.Collect(maps.Values(m.live))
	m.mu.Unlock()
	for _, l := range lives {
		l.mu.Lock()
		if !l.dead && l.rec.BaseSnapshot == sn.ID {
			l.rec.BaseSnapshot = sn.ParentID
			if err := m.st.Put(ctx, l.rec); err != nil {
				m.log.Warn("re-basing sandbox", "sandbox.id", l.rec.ID, "err", err)
			}
		}
		l.mu.Unlock()
	}
	m.pool.dropStandby(sn.ID)
	m.images.remove(sn.Image)
	m.log.Info("snapshot deleted", "snapshot.id", sn.ID)
	return nil
}

// unrecordSnapshot deletes a snapshot's record under snap, moving its
// children up to its parent, and returns it.
func (m *Manager) unrecordSnapshot(ctx context.Context, idOrName string) (*sandbox.Snapshot, error) {
	m.snap.Lock()
	defer m.snap.Unlock()
	sn, err := m.findSnapshot(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	all, err := m.st.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, c := range all {
		if c.ParentID == sn.ID {
			c.ParentID = sn.ParentID
			if err := m.st.PutSnapshot(ctx, c); err != nil {
				return nil, err
			}
		}
	}
	if err := m.st.DeleteSnapshot(ctx, sn.ID); err != nil {
		return nil, err
	}
	return sn, nil
}

// imageRefs counts restores reading each image, so that deleting an image
// waits until the last one is done. Safe for concurrent use.
type imageRefs struct {
	mu     sync.Mutex
	n      map[string]int
	doomed map[string]bool
}

func (r *imageRefs) acquire(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n, r.doomed = map[string]int{}, map[string]bool{}
	}
	r.n[path]++
}

func (r *imageRefs) release(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n[path]--; r.n[path] <= 0 {
		delete(r.n, path)
		if r.doomed[path] {
			delete(r.doomed, path)
			_ = os.RemoveAll(path)
		}
	}
}

// remove deletes the image now, or when its last reader is done.
func (r *imageRefs) remove(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n[path] > 0 {
		r.doomed[path] = true
		return
	}
	_ = os.RemoveAll(path)
}

// treeRoot follows parent links to the root of a snapshot's tree.
func treeRoot(byID map[string]*sandbox.Snapshot, id string) string {
	for i := 0; i < 10000; i++ {
		sn, ok := byID[id]
		if !ok || sn.ParentID == "" {
			return id
		}
		id = sn.ParentID
	}
	return id
}

// inTree reports whether sn belongs to the snapshot tree of the sandbox:
// the tree of the snapshot its state came from, or of snapshots taken of it.
func (m *Manager) inTree(ctx context.Context, rec *sandbox.Sandbox, sn *sandbox.Snapshot) (bool, error) {
	all, err := m.st.ListSnapshots(ctx)
	if err != nil {
		return false, err
	}
	byID := map[string]*sandbox.Snapshot{}
	for _, s := range all {
		byID[s.ID] = s
	}
	root := treeRoot(byID, sn.ID)
	if rec.BaseSnapshot != "" && treeRoot(byID, rec.BaseSnapshot) == root {
		return true, nil
	}
	for _, s := range all {
		if s.SandboxID == rec.ID && treeRoot(byID, s.ID) == root {
			return true, nil
		}
	}
	return false, nil
}

// Rollback restores the sandbox in place to a snapshot of its tree: same
// id, same address, the snapshot's state. The new state is started before
// the old one is dropped, so a failed rollback leaves the sandbox as it was.
func (m *Manager) Rollback(ctx context.Context, id, snapshot string) (*sandbox.Sandbox, error) {
	defer m.adm.busy()()
	sn, err := m.findSnapshot(ctx, snapshot)
	if err != nil {
		return nil, err
	}
	m.images.acquire(sn.Image)
	defer m.images.release(sn.Image)
	l, err := m.locked(id)
	if err != nil {
		return nil, err
	}
	defer l.mu.Unlock()
	if l.rec.State != sandbox.StateRunning {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is paused: resume it before rolling back", id)
	}
	ok, err := m.inTree(ctx, l.rec, sn)
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
	nb := m.resumeStandby(ctx, sn.ID, lim)
	if nb == nil {
		release, err := m.adm.acquire(ctx)
		if err != nil {
			return nil, err
		}
		nb, err = m.restoreBox(ctx, sn.Image, sn.Rootfs, lim)
		release()
		if err != nil {
			return nil, fmt.Errorf("rolling back sandbox %s: %w", id, err)
		}
	}
	if err := errors.Join(m.applyPolicy(nb, l.rec.Network), m.postInit(ctx, nb.transport, sandboxEnvs(l.rec, nil), &lim)); err != nil {
		m.destroyBox(context.WithoutCancel(ctx), nb)
		return nil, fmt.Errorf("rolling back sandbox %s: %w", id, err)
	}
	old, oldRID, oldBase := l.box, l.rec.RuntimeID, l.rec.BaseSnapshot
	l.box, l.rec.RuntimeID, l.rec.BaseSnapshot = nb, nb.rid, sn.ID
	if err := m.st.Put(ctx, l.rec); err != nil {
		l.box, l.rec.RuntimeID, l.rec.BaseSnapshot = old, oldRID, oldBase
		m.destroyBox(context.WithoutCancel(ctx), nb)
		return nil, err
	}
	m.watchBox(ctx, l, nb)
	// Off the critical path, and after the client's next request: a
	// destroy costs CPU that request would wait for.
	m.destroyLater(old, idleGrace)
	m.pool.useStandby(sn, lim)
	m.log.Info("sandbox rolled back", "sandbox.id", id, "snapshot.id", sn.ID)
	return cloneRecord(l.rec), nil
}

// ForkResult is one child of a fork: a sandbox or an error.
type ForkResult struct {
	Sandbox *sandbox.Sandbox
	Err     error
}

// Fork makes n independent copies of the running sandbox at one instant
// (one checkpoint, n parallel restores); the parent keeps running. A
// failed child does not fail the others.
func (m *Manager) Fork(ctx context.Context, id string, n int, timeout time.Duration) ([]ForkResult, error) {
	if n < 1 || n > m.cfg.MaxFork {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "count must be between 1 and %d", m.cfg.MaxFork)
	}
	if timeout == 0 {
		timeout = m.cfg.DefaultTimeout
	}
	if err := m.checkTimeout(timeout); err != nil {
		return nil, err
	}
	l, err := m.locked(id)
	if err != nil {
		return nil, err
	}
	if l.rec.State != sandbox.StateRunning {
		l.mu.Unlock()
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is paused: resume it before forking", id)
	}
	img := filepath.Join(m.forkDir(), randomHex(8))
	err = m.checkpointInto(ctx, l.box.rid, img, true)
	parent, limits := cloneRecord(l.rec), l.box.limits
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(img)
	t0 := time.Now()
	results := make([]ForkResult, n)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			results[i].Sandbox, results[i].Err = m.forkChild(ctx, parent, img, limits, timeout)
		})
	}
	wg.Wait()
	timing.Since(ctx, "children", t0)
	return results, nil
}

func (m *Manager) forkChild(ctx context.Context, parent *sandbox.Sandbox, img string, limits sandbox.Limits, timeout time.Duration) (*sandbox.Sandbox, error) {
	release, err := m.adm.acquire(ctx)
	if err != nil {
		return nil, err
	}
	b, err := m.restoreBox(ctx, img, parent.Rootfs, limits)
	release()
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	rec := cloneRecord(parent)
	rec.ID, rec.AccessToken, rec.RuntimeID, rec.BootMode = newID(), randomHex(16), b.rid, "fork"
	rec.ParentID, rec.StartedAt, rec.EndAt, rec.PausedImage = parent.ID, now, now.Add(timeout), ""
	if err := m.adoptNew(ctx, rec, b, nil); err != nil {
		return nil, err
	}
	return cloneRecord(rec), nil
}

// Merge makes a fork child's state the parent's, under the parent's id and
// address; the child's id goes away and the parent's old state is dropped.
// Other children are untouched.
func (m *Manager) Merge(ctx context.Context, parentID, childID string) (*sandbox.Sandbox, error) {
	if parentID == childID {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "cannot merge a sandbox into itself")
	}
	first, second := parentID, childID
	if second < first {
		first, second = second, first
	}
	a, err := m.locked(first)
	if err != nil {
		return nil, err
	}
	defer a.mu.Unlock()
	b, err := m.locked(second)
	if err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	p, c := a, b
	if p.rec.ID != parentID {
		p, c = b, a
	}
	if c.rec.ParentID != parentID {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is not a fork child of %q", childID, parentID)
	}
	if p.rec.State != sandbox.StateRunning || c.rec.State != sandbox.StateRunning {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "both sandboxes must be running to merge")
	}
	if err := m.applyPolicy(c.box, p.rec.Network); err != nil { // the parent's policy stays
		return nil, err
	}
	if err := m.postInit(ctx, c.box.transport, sandboxEnvs(p.rec, nil), nil); err != nil { // and its identity
		return nil, err
	}
	old := p.box
	prev := *p.rec
	p.box, p.rec.RuntimeID, p.rec.BaseSnapshot = c.box, c.box.rid, c.rec.BaseSnapshot
	if err := m.st.Put(ctx, p.rec); err != nil {
		p.box, *p.rec = old, prev
		_ = m.postInit(context.WithoutCancel(ctx), c.box.transport, sandboxEnvs(c.rec, nil), nil)
		return nil, err
	}
	m.watchBox(ctx, p, p.box)
	m.forget(c)
	c.box = nil
	if err := m.st.Delete(ctx, childID); err != nil {
		m.log.Warn("deleting merged child record", "sandbox.id", childID, "err", err)
	}
	m.destroyLater(old, 0)
	m.log.Info("sandbox merged", "sandbox.id", parentID, "child", childID)
	return cloneRecord(p.rec), nil
}
