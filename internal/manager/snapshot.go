package manager

import (
	"context"
	"maps"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/snapshots"
)

// Snapshots of a sandbox: the manager takes the checkpoint and keeps the
// sandboxes' bases; the records and images are internal/snapshots'.

// Snapshot saves the sandbox's whole state (memory, processes, files,
// sockets) as a new snapshot; the sandbox keeps running.
func (m *Manager) Snapshot(ctx context.Context, id, name string) (*sandbox.Snapshot, error) {
	l, err := m.begin(ctx, id, "taking a snapshot of it", running)
	if err != nil {
		return nil, err
	}
	defer l.op.Unlock()
	if err := snapshots.CheckName(name); err != nil {
		return nil, err
	}
	if err := m.snaps.CheckRoom(ctx); err != nil {
		return nil, err
	}
	sid := m.ids.SnapshotID()
	dir := m.snaps.Dir(sid)
	if err := m.checkpoint(ctx, l, dir); err != nil {
		return nil, err
	}
	lim := m.limits(l.rec)
	sn := &sandbox.Snapshot{
		ID: sid, Team: l.rec.Team, Names: []string{}, ParentID: l.rec.BaseSnapshot, SandboxID: id, TemplateID: l.rec.TemplateID,
		Rootfs: l.rec.Rootfs, Image: dir, SizeBytes: box.ImageSize(dir), CreatedAt: time.Now().UTC(),
		Envs: maps.Clone(l.rec.Envs), Network: l.rec.Network.Clone(), Runtime: m.cfg.RuntimeBuild,
		CPUCount: lim.CPUCount, MemoryMB: lim.MemoryMB, DiskMB: lim.DiskMB, PidsMax: lim.PidsMax, OpenFiles: lim.OpenFiles,
	}
	if name != "" {
		sn.Names = []string{name}
	}
	if err := m.snaps.Add(ctx, sn); err != nil {
		m.boxes.RemoveImage(dir)
		return nil, err
	}
	l.update(func() { l.rec.BaseSnapshot = sid })
	if err := m.put(ctx, l.rec); err != nil {
		m.log.Warn("recording snapshot base", "sandbox.id", id, "err", err)
	}
	m.log.Info("snapshot taken", "sandbox.id", id, "snapshot.id", sid, "bytes", sn.SizeBytes)
	return sn, nil
}

// ListSnapshots returns every snapshot (of the request's team), oldest
// first.
func (m *Manager) ListSnapshots(ctx context.Context) ([]*sandbox.Snapshot, error) {
	return m.snaps.List(ctx)
}

// GetSnapshot returns one snapshot by id or name.
func (m *Manager) GetSnapshot(ctx context.Context, idOrName string) (*sandbox.Snapshot, error) {
	return m.snaps.Find(ctx, idOrName)
}

// SnapshotUsage returns the disk snapshot images use and the cap.
func (m *Manager) SnapshotUsage(ctx context.Context) (sandbox.SnapshotUsage, error) {
	return m.snaps.Usage(ctx)
}

// SnapshotImage returns the image directory of this host's snapshot id
// and the metadata its upload exports it with (snapshots.Offer): a cluster
// host offers it to the host of a fork child made elsewhere.
func (m *Manager) SnapshotImage(ctx context.Context, id string) (string, map[string]string, error) {
	return m.snaps.Offer(ctx, id)
}

// DeleteSnapshot removes a snapshot and, once no restore reads it, its
// image. Its children in the tree move up to its parent, and so do the
// sandboxes based on it.
//
// The tree is rewritten under the records' lock; the sandboxes are
// re-based after it is released, each under its own op (lock order:
// Live.op before the records', see Manager). A snapshot being taken of a
// sandbox meanwhile holds that sandbox's op until its base is recorded, so
// the re-base sees it.
func (m *Manager) DeleteSnapshot(ctx context.Context, idOrName string) error {
	sn, err := m.snaps.Delete(ctx, idOrName)
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
	m.log.Info("snapshot deleted", "snapshot.id", sn.ID)
	return nil
}
