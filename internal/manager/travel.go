package manager

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/snapshots"
)

// Paused sandboxes in the chunk store. A sandbox paused to disk has its
// image exported to the chunk store after the pause answers
// (internal/snapshots' upload queue, retried), and the image's root
// recorded on it (PausedRoot). A single host then drops the disk's copy,
// and a cluster's host once the sandbox's row shows the root (Published);
// a resume imports it (fetchPaused, connect.go), and another host the
// cluster moves it to adopts it on first use (adoptMoved, live.go).

// queuePausedUpload queues the export of a sandbox's paused image to the
// chunk store, where it costs only the chunks no other image has (the
// disk's copy is then dropped).
func (m *Manager) queuePausedUpload(id string) {
	if m.images == nil {
		return
	}
	m.snaps.Queue(snapshots.Job{What: "paused sandbox", ID: id, Try: func(ctx context.Context) (bool, error) {
		return m.uploadPausedOnce(ctx, id)
	}})
}

// uploadPausedOnce exports a paused sandbox's image and records its root;
// done reports that no other attempt is needed (resumed or killed
// meanwhile, uploaded, or an image the store refuses for good). The export
// runs without the sandbox's op, so that a resume need not wait for it: the
// root is recorded only if the spill it read is still the sandbox's.
func (m *Manager) uploadPausedOnce(ctx context.Context, id string) (done bool, err error) {
	l, err := m.begin(ctx, id, "uploading its paused image", spilled)
	if err != nil {
		return true, nil // resumed, killed or gone
	}
	rec, spill := l.record(), l.spills
	if rec.PausedImage == "" || rec.PausedRoot != "" {
		l.op.Unlock()
		return true, nil
	}
	uctx, stop := context.WithCancel(ctx)
	defer stop()
	l.stopUpload = stop // a resume or a kill cancels it (leaveDisk)
	l.op.Unlock()
	t0 := time.Now()
	meta := map[string]string{"sandbox": id, "template": rec.TemplateID, "runsc": m.cfg.RuntimeBuild, "pause": rec.PauseMode}
	root, uploaded, err := m.images.Export(uctx, rec.PausedImage, meta)
	if l2, berr := m.begin(ctx, id, "recording its paused image's root", spilled); berr != nil {
		return true, nil // resumed, killed or gone meanwhile (a new spill queues its own)
	} else if l2 != l || l.spills != spill {
		l2.op.Unlock()
		return true, nil
	}
	defer l.op.Unlock()
	l.stopUpload = nil
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
	// A single host keeps it in the store only from here (a resume
	// imports it: fetchPaused); a cluster's host once the sandbox's row
	// names the root (Published), which this put writes: until then, its
	// copy is what uploads it again should the cluster's collection take
	// it (recheckPaused).
	drop := m.cluster == nil
	l.update(func() {
		l.rec.PausedRoot = root
		if drop {
			l.rec.PausedImage = ""
		}
	})
	if err := m.put(ctx, l.rec); err != nil {
		l.update(func() { l.rec.PausedRoot, l.rec.PausedImage = "", rec.PausedImage })
		return false, err
	}
	m.log.Info("paused sandbox uploaded", "sandbox.id", id, "root", root, "uploaded_bytes", uploaded, "ms", time.Since(t0).Milliseconds())
	if drop {
		m.removeCopy(id, rec.PausedImage)
	}
	return true, nil
}

// Published drops the disk's copy of a cluster host's paused sandbox once
// the sandbox's row in the cluster names its image's root in the chunk
// store (clusterhost calls it after writing such a row): the cluster's
// collection keeps the image from then on, and a resume imports it, as
// on a single host.
func (m *Manager) Published(ctx context.Context, id, root string) {
	l, err := m.begin(ctx, id, "dropping its paused image's copy", spilled)
	if err != nil {
		return // resumed, killed or gone
	}
	defer l.op.Unlock()
	if l.rec.PausedRoot == root && l.rec.PausedImage != "" {
		m.dropCopy(ctx, l)
	}
}

// dropCopy removes the disk's copy of a paused image the chunk store
// holds (PausedRoot); on failure the copy stays, and a resume uses it.
// Caller holds l.op.
func (m *Manager) dropCopy(ctx context.Context, l *Live) {
	img := l.rec.PausedImage
	l.update(func() { l.rec.PausedImage = "" })
	if err := m.put(ctx, l.rec); err != nil {
		l.update(func() { l.rec.PausedImage = img })
		m.log.Warn("keeping a paused image on the disk: recording its drop failed", "sandbox.id", l.rec.ID, "err", err)
		return
	}
	m.removeCopy(l.rec.ID, img)
}

// removeCopy removes the disk's copy of sandbox id's uploaded paused image.
func (m *Manager) removeCopy(id, img string) {
	if err := os.RemoveAll(img); err != nil {
		m.log.Warn("removing a paused image from the disk after its upload", "sandbox.id", id, "err", err)
	}
}

// requeuePausedUploads queues the paused images a previous daemon left
// unexported.
func (m *Manager) requeuePausedUploads(ctx context.Context) {
	if m.images == nil {
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

// RecheckRoots uploads again the images of this host's paused sandboxes
// and snapshots whose manifest the chunk store no longer holds, retrying
// while the store does not answer. A cluster host calls it once its rows
// are written after it (re)joined: a host away for longer than the
// store's grace period may hold a root its rows never named (it died
// between an upload and its row write), which the cluster's collection
// then deleted; the image is still on this host's disk, and an export of
// it writes the same root again.
func (m *Manager) RecheckRoots(ctx context.Context) {
	if m.images == nil {
		return
	}
	for wait := time.Second; ; wait = min(2*wait, 5*time.Minute) {
		err := m.recheckPaused(ctx)
		if err == nil {
			err = m.snaps.RecheckRoots(ctx)
		}
		if err == nil || ctx.Err() != nil {
			return
		}
		m.log.Debug("rechecking the chunk store's roots deferred", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-m.closing:
			return
		case <-time.After(wait):
		}
	}
}

// recheckPaused is RecheckRoots for the paused sandboxes.
func (m *Manager) recheckPaused(ctx context.Context) error {
	recs, err := m.st.List(ctx)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		if rec.State != sandbox.StatePaused || rec.PausedRoot == "" || rec.PausedImage == "" {
			continue
		}
		if ok, err := m.images.Has(ctx, rec.PausedRoot); err != nil || ok {
			if err != nil {
				return err
			}
			continue
		}
		l, err := m.begin(ctx, rec.ID, "uploading its paused image again", spilled)
		if err != nil {
			continue // resumed or killed meanwhile
		}
		if l.rec.PausedRoot == rec.PausedRoot {
			l.update(func() { l.rec.PausedRoot = "" })
			if err := m.put(ctx, l.rec); err != nil {
				l.update(func() { l.rec.PausedRoot = rec.PausedRoot })
				l.op.Unlock()
				return err
			}
			m.log.Warn("a paused sandbox's image was missing from the chunk store; uploading it again", "sandbox.id", rec.ID, "root", rec.PausedRoot)
			m.queuePausedUpload(rec.ID)
		}
		l.op.Unlock()
	}
	return nil
}
