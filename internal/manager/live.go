package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// The live set: the sandboxes this host holds, how an operation finds one
// (here, or moved here by the cluster) and starts on it (begin), and how
// one enters (add) and leaves it (forget).

// tombstoneTTL is how long the reason a sandbox died is remembered.
const tombstoneTTL = time.Hour

// lives returns the live sandboxes (copied out under mu).
func (m *Manager) lives() []*Live {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Values(m.live))
}

// lookup returns the live sandbox or a NotFound error.
func (m *Manager) lookup(ctx context.Context, id string) (*Live, error) {
	l, err := m.find(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) && m.cluster != nil {
		// Perhaps a paused sandbox the cluster moved here: also one that
		// died here, as a copy dropped when it moved away and now moved
		// back (its tombstone answers only if the cluster has no row
		// naming this host).
		if aerr := m.adoptMoved(ctx, id); aerr == nil {
			return m.find(ctx, id)
		} else if !errors.Is(aerr, errdefs.ErrNotFound) {
			return nil, aerr
		}
	}
	return l, err
}

// find is lookup among the sandboxes this host holds.
func (m *Manager) find(ctx context.Context, id string) (*Live, error) {
	m.mu.Lock()
	l := m.live[id]
	m.mu.Unlock()
	if l != nil && !sandbox.Sees(ctx, l.team()) {
		l = nil // another team's: as good as absent
	}
	if l == nil {
		if msg := m.diedMessage(id); msg != "" {
			return nil, errors.Join(errdefs.New(errdefs.ErrNotFound, "%s", msg), sandbox.ErrDied)
		}
		return nil, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	return l, nil
}

// diedMessage is the caller-facing message for a sandbox that died, or "".
func (m *Manager) diedMessage(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.tombs[id]
	if !ok {
		return ""
	}
	if time.Since(t.at) > tombstoneTTL {
		delete(m.tombs, id)
		return ""
	}
	return fmt.Sprintf("sandbox %q died at %s: %s", id, t.at.UTC().Format(time.RFC3339), t.reason)
}

// bury remembers why sandbox id is gone, for its later callers.
func (m *Manager) bury(id, reason string) {
	m.mu.Lock()
	m.tombs[id] = tomb{reason: reason, at: time.Now()}
	m.mu.Unlock()
}

// begin starts an operation on sandbox id that accepts the phases allowed:
// it returns the sandbox with op held (the caller unlocks it), or the
// error the operation gets in the sandbox's phase. doing names the
// operation in messages ("taking a snapshot of it").
func (m *Manager) begin(ctx context.Context, id, doing string, allowed ...phase) (*Live, error) {
	l, err := m.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	l.op.Lock()
	if err := l.require(doing, allowed...); err != nil {
		l.op.Unlock()
		return nil, err
	}
	return l, nil
}

// exists reports whether a sandbox id is live, whatever its team.
func (m *Manager) exists(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[id] != nil
}

// add puts l in the live set (and starts its samples). A running or
// frozen sandbox also needs its box watched and its timer armed:
// register.
func (m *Manager) add(l *Live) {
	m.samples.Add(l.rec.ID)
	m.mu.Lock()
	m.live[l.rec.ID] = l
	m.mu.Unlock()
}

// forget makes l dead, drops it from the live set and returns its box.
// Caller holds l.op.
func (m *Manager) forget(l *Live) *box.Box {
	l.mu.Lock()
	b := l.box
	l.phase, l.box = dead, nil
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	m.mu.Lock()
	delete(m.live, l.rec.ID)
	m.mu.Unlock()
	m.samples.Forget(l.rec.ID)
	return b
}

// adoptMoved takes over a paused sandbox the cluster moved to this host:
// its image imported from the store (phase "import"), its record stored
// here, which writes its row (the row names this host now). ErrNotFound if
// the cluster moved no such sandbox here.
//
// Paused sandboxes travel in a cluster: one paused to disk has its image
// exported to the chunk store after the pause answers (travel.go), and the
// image's root recorded on it (PausedRoot), which its row shows. When its
// host is lost or drained, a gateway moves the row to another host
// (clusterdb.Move), which adopts it here on its first use, paused under
// the same id, with the same access token (tokens derive from the id).
func (m *Manager) adoptMoved(ctx context.Context, id string) error {
	if m.cluster == nil || m.images == nil {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	defer m.snaps.Lock("paused/" + id)()
	if m.exists(id) {
		return nil // adopted by a connect meanwhile
	}
	rec, err := m.cluster.MovedHere(ctx, id)
	if err != nil {
		return err
	}
	if rec.State != sandbox.StatePaused || rec.PausedRoot == "" || !sandbox.Sees(ctx, rec.Team) {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	if rec.Rootfs, err = m.localRoot(ctx, rec.Team, rec.Rootfs); err != nil {
		return fmt.Errorf("sandbox %q: %w", id, err)
	}
	if _, err := os.Stat(rec.Rootfs); err != nil {
		return errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q: its template's root filesystem (%s) is not on this host", id, rec.Rootfs)
	}
	t0 := time.Now()
	dir, fetched, err := m.importPaused(ctx, id, rec.PausedRoot)
	if err != nil {
		return err
	}
	cu := cleanup.Make(func() { os.RemoveAll(dir) })
	defer cu.Clean()
	rec.PausedImage, rec.RuntimeID, rec.State = dir, "", sandbox.StatePaused
	if err := m.put(ctx, rec); err != nil {
		return err
	}
	cu.Release()
	m.add(newLive(rec, nil)) // on disk: no box to watch, no timer
	m.log.Info("paused sandbox moved to this host", "sandbox.id", id, "fetched_bytes", fetched, "ms", time.Since(t0).Milliseconds())
	return nil
}

// importPaused imports a paused sandbox's image root from the chunk store
// into its place on the disk (replacing a copy of a time it was here
// before), timed as Server-Timing's import; on failure nothing is left.
func (m *Manager) importPaused(ctx context.Context, id, root string) (dir string, fetched int64, err error) {
	dir = m.pausedDir(id)
	os.RemoveAll(dir)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", 0, err
	}
	t0 := time.Now()
	fetched, err = m.images.Import(ctx, root, dir)
	timing.Since(ctx, "import", t0)
	if err != nil {
		os.RemoveAll(dir)
		return "", 0, m.snaps.ImportError(fmt.Sprintf("sandbox %q", id), root, err)
	}
	return dir, fetched, nil
}

// Get returns a copy of the sandbox's record.
func (m *Manager) Get(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	l, err := m.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	return l.record(), nil
}

// List returns copies of every sandbox's record (of the request's team),
// oldest first.
func (m *Manager) List(ctx context.Context) ([]*sandbox.Sandbox, error) {
	lives := m.lives()
	out := make([]*sandbox.Sandbox, 0, len(lives))
	for _, l := range lives {
		if rec := l.record(); rec != nil && sandbox.Sees(ctx, rec.Team) {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b *sandbox.Sandbox) int {
		return cmp.Or(a.StartedAt.Compare(b.StartedAt), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}
