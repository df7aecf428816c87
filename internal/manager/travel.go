package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// Paused sandboxes that travel (a cluster: Deps.Cluster). A sandbox paused
// to disk has its image exported to the chunk store after the pause
// answers (the uploads queue, retried), and the image's root recorded on
// it (PausedRoot), which its row shows. When its host is lost or drained,
// a gateway moves the row to another host (clusterdb.Move), which adopts
// it on the first connect (adoptMoved): the image imported from the store
// into its paused directory, the sandbox paused here under the same id,
// with the same access token (tokens derive from the id).

// pausedUpload is the uploads queue's entry for a paused sandbox's image.
const pausedUpload = "paused/"

// queuePausedUpload queues the export of a sandbox's paused image (in a
// cluster; a single host keeps it on its disk only).
func (m *Manager) queuePausedUpload(id string) {
	if m.cluster != nil && m.images != nil {
		m.up.push(pausedUpload + id)
	}
}

// uploadPausedOnce exports a paused sandbox's image and records its root;
// done reports that no other attempt is needed (resumed or killed
// meanwhile, uploaded, or an image the store refuses for good).
func (m *Manager) uploadPausedOnce(ctx context.Context, id string) (done bool, err error) {
	m.up.exclusive.Lock()
	defer m.up.exclusive.Unlock()
	l, err := m.begin(ctx, id, "uploading its paused image", spilled)
	if err != nil {
		return true, nil // resumed, killed or gone
	}
	defer l.op.Unlock()
	rec := l.record()
	if rec.PausedImage == "" || rec.PausedRoot != "" {
		return true, nil
	}
	t0 := time.Now()
	meta := map[string]string{"sandbox": id, "template": rec.TemplateID, "runsc": m.cfg.RuntimeBuild, "pause": rec.PauseMode}
	root, uploaded, err := m.images.Export(ctx, rec.PausedImage, meta)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return true, nil // closing: the next daemon queues it again
	case errors.Is(err, errdefs.ErrCorrupt), errors.Is(err, errdefs.ErrNotFound):
		m.log.Error("uploading a paused sandbox's image failed for good: it resumes on this host only", "sandbox.id", id, "err", err)
		return true, nil
	default:
		return false, err
	}
	l.update(func() { l.rec.PausedRoot = root })
	if err := m.put(ctx, l.rec); err != nil {
		l.update(func() { l.rec.PausedRoot = "" })
		return false, err
	}
	m.log.Info("paused sandbox uploaded", "sandbox.id", id, "root", root, "uploaded_bytes", uploaded, "ms", time.Since(t0).Milliseconds())
	return true, nil
}

// requeuePausedUploads queues the paused images a previous daemon left
// unexported.
func (m *Manager) requeuePausedUploads(ctx context.Context) {
	if m.cluster == nil {
		return
	}
	recs, err := m.st.List(ctx)
	if err != nil {
		m.log.Warn("listing sandboxes to upload their paused images", "err", err)
		return
	}
	for _, rec := range recs {
		if rec.State == sandbox.StatePaused && rec.PausedImage != "" && rec.PausedRoot == "" {
			m.queuePausedUpload(rec.ID)
		}
	}
}

// adoptMoved takes over a paused sandbox the cluster moved to this host:
// its image imported from the store (phase "import"), its record stored
// here, which writes its row (the row names this host now). ErrNotFound if
// the cluster moved no such sandbox here.
func (m *Manager) adoptMoved(ctx context.Context, id string) error {
	if m.cluster == nil || m.images == nil {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	lock := m.up.importLock(pausedUpload + id)
	lock.Lock()
	defer lock.Unlock()
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
	if rec.Rootfs, err = m.localRoot(ctx, rec.Team, fmt.Sprintf("sandbox %q", id), rec.Rootfs); err != nil {
		return err
	}
	dir := m.pausedDir(id)
	os.RemoveAll(dir) // a copy of a time it lived here before
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	t0 := time.Now()
	fetched, err := m.images.Import(ctx, rec.PausedRoot, dir)
	timing.Since(ctx, "import", t0)
	if err != nil {
		os.RemoveAll(dir)
		return m.importError(fmt.Sprintf("sandbox %q", id), rec.PausedRoot, err)
	}
	rec.PausedImage, rec.RuntimeID, rec.State = dir, "", sandbox.StatePaused
	if err := m.put(ctx, rec); err != nil {
		os.RemoveAll(dir)
		return err
	}
	m.register(newLive(rec, nil))
	m.log.Info("paused sandbox moved to this host", "sandbox.id", id, "fetched_bytes", fetched, "ms", time.Since(t0).Milliseconds())
	return nil
}

// isPausedUpload reports whether a queue entry is a paused sandbox's, and
// its id.
func isPausedUpload(entry string) (string, bool) { return strings.CutPrefix(entry, pausedUpload) }
