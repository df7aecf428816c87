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
	"strings"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
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

// findSnapshot looks a snapshot of the request's team up by id, then by
// name.
func (m *Manager) findSnapshot(ctx context.Context, idOrName string) (*sandbox.Snapshot, error) {
	if sn, err := m.st.GetSnapshot(ctx, idOrName); err == nil && sandbox.Sees(ctx, sn.Team) {
		return sn, nil
	}
	all, err := m.st.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, sn := range all {
		if slices.Contains(sn.Names, idOrName) && sandbox.Sees(ctx, sn.Team) {
			return sn, nil
		}
	}
	return nil, errdefs.New(errdefs.ErrNotFound, "snapshot %q not found", idOrName)
}

// findSource looks up a snapshot to start a sandbox from (create,
// rollback): this host's, else, in a cluster, one another host took and
// uploaded to the chunk store. Such a snapshot has no Image: imageOf
// imports it for each use.
func (m *Manager) findSource(ctx context.Context, idOrName string) (*sandbox.Snapshot, error) {
	sn, err := m.findSnapshot(ctx, idOrName)
	if err == nil || m.cluster == nil || m.images == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return sn, err
	}
	team, _ := sandbox.TeamOf(ctx)
	if sn, err = m.cluster.FindSnapshot(ctx, team, idOrName); err != nil {
		return nil, err
	}
	if p, ok := sandbox.ImagePeerOf(ctx); ok && p.Root != "" && (p.Snapshot == sn.ID || slices.Contains(sn.Names, p.Snapshot)) &&
		(sn.Upload != sandbox.UploadDone || sn.StoreRoot == "") {
		// Its host offers its image (sandbox.ImagePeer): imported from there first.
		sn.Upload, sn.StoreRoot = sandbox.UploadDone, p.Root
	}
	switch {
	case sn.Upload != sandbox.UploadDone || sn.StoreRoot == "":
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "snapshot %q is on another host and not in the chunk store yet (upload: %s); retry once it is uploaded", sn.ID, cmp.Or(string(sn.Upload), "none"))
	case sn.Runtime != m.cfg.RuntimeBuild:
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "snapshot %q was written by runtime build %q; this host runs %q", sn.ID, sn.Runtime, m.cfg.RuntimeBuild)
	}
	if sn.Rootfs, err = m.localRoot(ctx, sn.Team, fmt.Sprintf("snapshot %q", sn.ID), sn.Rootfs); err != nil {
		return nil, err
	}
	sn.Image = ""
	return sn, nil
}

// SnapshotUsage returns the disk snapshot images use and the cap.
func (m *Manager) SnapshotUsage(ctx context.Context) (sandbox.SnapshotUsage, error) {
	all, err := m.st.ListSnapshots(ctx)
	u := sandbox.SnapshotUsage{CapBytes: m.cfg.SnapshotCapBytes, Count: len(all), Uploads: map[sandbox.UploadState]int{}}
	for _, sn := range all {
		u.TotalBytes += sn.SizeBytes
		if sn.Upload != "" {
			u.Uploads[sn.Upload]++
		}
	}
	return u, err
}

// checkDiskRoom refuses a new image when snapshots reach the cap or the
// disk is nearly full.
func (m *Manager) checkDiskRoom(ctx context.Context) error {
	u, err := m.SnapshotUsage(ctx)
	if err != nil {
		return err
	}
	if u.CapBytes > 0 && u.TotalBytes >= u.CapBytes {
		return errdefs.New(errdefs.ErrResourceExhausted, "snapshot disk cap reached: %d MiB used of %d MiB; delete snapshots first", u.TotalBytes>>20, u.CapBytes>>20)
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
	l, err := m.begin(ctx, id, "taking a snapshot of it", running)
	if err != nil {
		return nil, err
	}
	defer l.op.Unlock()
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := m.checkDiskRoom(ctx); err != nil {
		return nil, err
	}
	sid := m.ids.SnapshotID()
	dir := m.snapshotDir(sid)
	if err := m.checkpoint(ctx, l, dir); err != nil {
		return nil, err
	}
	lim := m.limits(l.rec)
	sn := &sandbox.Snapshot{
		ID: sid, Team: l.rec.Team, Names: []string{}, ParentID: l.rec.BaseSnapshot, SandboxID: id, TemplateID: l.rec.TemplateID,
		Rootfs: l.rec.Rootfs, Image: dir, SizeBytes: imageSize(dir), CreatedAt: time.Now().UTC(),
		Envs: maps.Clone(l.rec.Envs), Network: l.rec.Network.Clone(), Runtime: m.cfg.RuntimeBuild,
		CPUCount: lim.CPUCount, MemoryMB: lim.MemoryMB, DiskMB: lim.DiskMB, PidsMax: lim.PidsMax, OpenFiles: lim.OpenFiles,
	}
	if name != "" {
		sn.Names = []string{name}
	}
	if m.images != nil {
		sn.Upload = sandbox.UploadPending
	}
	if err := m.recordSnapshot(ctx, sn); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if m.images != nil {
		m.up.push(sid) // off the request path: the image is safe on disk
	}
	l.update(func() { l.rec.BaseSnapshot = sid })
	if err := m.put(ctx, l.rec); err != nil {
		m.log.Warn("recording snapshot base", "sandbox.id", id, "err", err)
	}
	m.log.Info("snapshot taken", "sandbox.id", id, "snapshot.id", sid, "bytes", sn.SizeBytes)
	return sn, nil
}

// checkpoint writes a leave-running checkpoint of l's box to dir, as
// foreground work (no pool refill competes with it). Caller holds l.op.
func (m *Manager) checkpoint(ctx context.Context, l *Live, dir string) error {
	defer m.adm.Busy()()
	return m.boxes.Checkpoint(ctx, l.box, dir, true)
}

// recordSnapshot stores a new snapshot under snap. A name moves to the
// newest snapshot that takes it (as E2B's named snapshots do: the older one
// stays, reachable by id); a parent deleted meanwhile is dropped.
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

// ListSnapshots returns every snapshot (of the request's team), oldest
// first.
func (m *Manager) ListSnapshots(ctx context.Context) ([]*sandbox.Snapshot, error) {
	all, err := m.st.ListSnapshots(ctx)
	all = slices.DeleteFunc(all, func(sn *sandbox.Snapshot) bool { return !sandbox.Sees(ctx, sn.Team) })
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
// is released, each under its own op (lock order: Live.op before snap, see
// Manager). A snapshot being taken of a sandbox meanwhile holds that
// sandbox's op until its base is recorded, so the re-base sees it.
func (m *Manager) DeleteSnapshot(ctx context.Context, idOrName string) error {
	sn, err := m.unrecordSnapshot(ctx, idOrName)
	if err != nil {
		return err
	}
	for _, l := range m.lives() {
		l.op.Lock()
		if l.phase != dead && l.rec.BaseSnapshot == sn.ID {
			l.update(func() { l.rec.BaseSnapshot = sn.ParentID })
			if err := m.put(ctx, l.rec); err != nil {
				m.log.Warn("re-basing sandbox", "sandbox.id", l.rec.ID, "err", err)
			}
		}
		l.op.Unlock()
	}
	m.pool.DropStandby(sn.ID)
	m.boxes.RemoveImage(sn.Image)
	m.forgetStored(sn)
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
	byID := map[string]*sandbox.Snapshot{sn.ID: sn} // sn may be another host's
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

// imageSize is the bytes an image directory holds of its own. Its
// base-*.img are the images it references instead of holding their pages
// (internal/runtime/gvisor/bases.go): hard links to files other images
// hold, which cost no disk and are not counted, or copies (of an image that
// was in memory or on another filesystem), which are.
func imageSize(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && strings.HasPrefix(e.Name(), "base-") && st.Nlink > 1 {
			continue
		}
		n += fi.Size()
	}
	return n
}
