package clusterhost

import (
	"context"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/store"
)

// FindSnapshot returns the record of a snapshot of team that another host
// of the cluster took, by id or name (the manager's SharedSnapshots): the
// record its host published with the snapshot's row, with the row's view of
// its upload. ErrNotFound if there is none (or it is this host's own: the
// local store has those).
func (m *Member) FindSnapshot(ctx context.Context, team, idOrName string) (*sandbox.Snapshot, error) {
	if m.db == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later")
	}
	row, err := m.db.FindSnapshot(ctx, team, idOrName)
	if err != nil {
		return nil, err
	}
	if row.HostSlot == m.Slot() {
		return nil, errdefs.New(errdefs.ErrNotFound, "snapshot %q not found", idOrName)
	}
	sn, err := store.DecodeSnapshot(row.Record)
	if err != nil || sn.ID != row.ID {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "snapshot %q is on host slot %d, which did not publish its record (an older cellfork?)", row.ID, row.HostSlot)
	}
	sn.StoreRoot, sn.Runtime = row.StoreRoot, row.Runtime
	if row.StoreRoot == "" && sn.Upload == sandbox.UploadDone {
		sn.Upload = sandbox.UploadPending // the row is the truth of what another host may fetch
	}
	return sn, nil
}

// MovedHere returns the record of a paused sandbox the cluster moved to
// this host (a gateway moved its row here: its host was lost or drained),
// as its old host published it, with its image's root in the store
// (manager.Cluster). ErrNotFound if the row does not say so.
func (m *Member) MovedHere(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	if m.db == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later")
	}
	row, err := m.db.GetRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	if row.HostSlot != m.Slot() || row.State != "paused" || row.StoreRoot == "" {
		return nil, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	if row.Runtime != m.cfg.Runtime {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q was paused by runtime build %q; this host runs %q", id, row.Runtime, m.cfg.Runtime)
	}
	rec, err := store.DecodeSandbox(row.Record)
	if err != nil || rec.ID != id {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q: its old host did not publish its record (an older cellfork?)", id)
	}
	rec.PausedRoot = row.StoreRoot
	return rec, nil
}
