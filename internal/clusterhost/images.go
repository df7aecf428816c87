package clusterhost

import (
	"context"
	"time"

	"github.com/cellfork/cellfork/internal/clusterdb"
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

// MovedHere returns the record of a sandbox the cluster moved to this
// host, as its old host published it (manager.Cluster): a paused one (its
// host was lost or drained), with its image's root in the store, or a
// running one (a merge across hosts hands it a child's box here).
// ErrNotFound if the row does not say so.
func (m *Member) MovedHere(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	if m.db == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later")
	}
	row, err := m.db.GetRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	paused := row.State == "paused" && row.StoreRoot != ""
	if row.HostSlot != m.Slot() || !paused && row.State != "running" {
		return nil, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	if paused && row.Runtime != m.cfg.Runtime {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q was paused by runtime build %q; this host runs %q", id, row.Runtime, m.cfg.Runtime)
	}
	rec, err := store.DecodeSandbox(row.Record)
	if err != nil || rec.ID != id {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q: its old host did not publish its record (an older cellfork?)", id)
	}
	rec.PausedRoot = row.StoreRoot
	return rec, nil
}

// StoreRoots claims this round of the shared chunk store's collection for
// this host and returns the roots the cluster's rows name
// (manager.Cluster): ok is false when another host ran a round less than
// every ago. A round is claimed a little early (every less a tenth), so
// hosts ticking at the same interval do not skip one. No round runs while
// a host that is not lost is silent: its rows may lag what it uploaded.
func (m *Member) StoreRoots(ctx context.Context, every time.Duration) ([]string, bool, error) {
	if m.db == nil {
		return nil, false, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later")
	}
	hosts, err := m.db.Hosts(ctx, time.Time{})
	if err != nil {
		return nil, false, err
	}
	for _, h := range hosts {
		if h.State != "lost" && h.Silent() {
			m.log.Info("chunk store collection waits: a host is silent", "slot", h.Slot)
			return nil, false, nil
		}
	}
	ok, err := m.db.ClaimJob(ctx, "store-gc", m.Slot(), every-every/10)
	if err != nil || !ok {
		return nil, false, err
	}
	roots, err := m.db.StoreRoots(ctx)
	return roots, err == nil, err
}

// PublishTemplate records a custom template build this host made, with
// this host's runsc build (templates.Shared).
func (m *Member) PublishTemplate(ctx context.Context, b clusterdb.TemplateBuild) error {
	if m.db == nil {
		return errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later")
	}
	b.Runtime = m.cfg.Runtime
	return m.db.PutTemplateBuild(ctx, b)
}

// SyncTemplate records a template's names and its builds' tags
// (clusterdb.SyncTemplate).
func (m *Member) SyncTemplate(ctx context.Context, team, templateID string, names []string, builds map[string][]string) error {
	if m.db == nil {
		return errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later")
	}
	return m.db.SyncTemplate(ctx, team, templateID, names, builds)
}

// FindTemplate returns the published build of team's template name that
// tag names (the newest with no tag): ErrFailedPrecondition when another
// runsc build made its warm image.
func (m *Member) FindTemplate(ctx context.Context, team, name, tag string) (clusterdb.TemplateBuild, error) {
	return m.runnable(name, func(db *clusterdb.DB) (clusterdb.TemplateBuild, error) {
		return db.FindTemplateBuild(ctx, team, name, tag)
	})
}

// FindTemplateBuild returns team's published build id, as FindTemplate.
func (m *Member) FindTemplateBuild(ctx context.Context, team, id string) (clusterdb.TemplateBuild, error) {
	return m.runnable(id, func(db *clusterdb.DB) (clusterdb.TemplateBuild, error) { return db.TemplateBuildByID(ctx, team, id) })
}

// runnable returns the build find finds if this host's runsc build made
// its warm image.
func (m *Member) runnable(name string, find func(*clusterdb.DB) (clusterdb.TemplateBuild, error)) (clusterdb.TemplateBuild, error) {
	if m.db == nil {
		return clusterdb.TemplateBuild{}, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later")
	}
	b, err := find(m.db)
	if err != nil {
		return b, err
	}
	if b.Runtime != m.cfg.Runtime {
		return b, errdefs.New(errdefs.ErrFailedPrecondition, "template %q was built by runtime build %q; this host runs %q", name, b.Runtime, m.cfg.Runtime)
	}
	return b, nil
}

// WarmImage returns the root of the warm image published for a built-in
// template's warm key ("" if none yet).
func (m *Member) WarmImage(ctx context.Context, name, key string) (string, error) {
	if m.db == nil {
		return "", errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later")
	}
	return m.db.WarmImageRoot(ctx, name, key)
}

// PublishWarm records root for a built-in template's warm key unless
// another host did first, and returns the root on record.
func (m *Member) PublishWarm(ctx context.Context, name, key, root string) (string, error) {
	if m.db == nil {
		return "", errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later")
	}
	return m.db.PublishWarmImage(ctx, name, key, root)
}
