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
