package snapshots

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// importsDir holds the images of other hosts' snapshots while they are
// restored (Image): emptied at start.
func (s *Snapshots) importsDir() string { return filepath.Join(s.cfg.DataDir, "imports") }

// Image returns the image directory to restore sn from and a func to call
// once the restore is done. A snapshot of this host restores from its own
// image, imported back from the store first if this host lost it
// (ensureImage). Another host's (Source: no Image) is imported into a
// directory of its own for this restore, which done deletes: the restored
// sandbox keeps the pages it maps, and its own checkpoints keep copies.
func (s *Snapshots) Image(ctx context.Context, sn *sandbox.Snapshot) (string, func(), error) {
	if sn.Image != "" {
		return sn.Image, func() {}, s.ensureImage(ctx, sn)
	}
	if err := os.MkdirAll(s.importsDir(), 0o700); err != nil {
		return "", nil, err
	}
	dir := filepath.Join(s.importsDir(), sn.ID+"-"+sandbox.RandomHex(4))
	t0 := time.Now()
	fetched, err := s.images.Import(ctx, sn.StoreRoot, dir)
	timing.Since(ctx, "import", t0)
	if err != nil {
		return "", nil, s.ImportError(fmt.Sprintf("snapshot %q", sn.ID), sn.StoreRoot, err)
	}
	s.log.Info("snapshot of another host imported", "snapshot.id", sn.ID, "fetched_bytes", fetched, "ms", time.Since(t0).Milliseconds())
	return dir, func() { s.boxes.RemoveImage(dir) }, nil
}

// ensureImage puts a snapshot's image back in its place from the store
// when the directory is gone (a host that lost it), verified, before a
// restore reads it (phase "import" in Server-Timing).
func (s *Snapshots) ensureImage(ctx context.Context, sn *sandbox.Snapshot) error {
	if s.images == nil || box.Complete(sn.Image) {
		return nil
	}
	if sn.Upload != sandbox.UploadDone || sn.StoreRoot == "" {
		return errdefs.New(errdefs.ErrFailedPrecondition, "snapshot %q: its image is not on this host and was not uploaded to the chunk store", sn.ID)
	}
	defer s.Lock(sn.ID)()
	if box.Complete(sn.Image) {
		return nil // imported by another restore meanwhile
	}
	if err := os.MkdirAll(filepath.Dir(sn.Image), 0o700); err != nil {
		return err
	}
	t0 := time.Now()
	fetched, err := s.images.Import(ctx, sn.StoreRoot, sn.Image)
	timing.Since(ctx, "import", t0)
	if err != nil {
		return s.ImportError(fmt.Sprintf("snapshot %q", sn.ID), sn.StoreRoot, err)
	}
	// Deleted while it was imported: its image must not stay behind.
	if _, err := s.st.GetSnapshot(ctx, sn.ID); err != nil {
		s.boxes.RemoveImage(sn.Image)
		return errdefs.New(errdefs.ErrNotFound, "snapshot %q not found", sn.ID)
	}
	s.log.Info("snapshot imported", "snapshot.id", sn.ID, "fetched_bytes", fetched, "ms", time.Since(t0).Milliseconds())
	return nil
}

// Lock serializes the imports of key (a snapshot's id, or another image's
// key of the caller's) until the returned func is called.
func (s *Snapshots) Lock(key string) (unlock func()) {
	s.up.mu.Lock()
	l := s.up.imports[key]
	if l == nil {
		l = &sync.Mutex{}
		s.up.imports[key] = l
	}
	s.up.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// ImportError is what a caller is told of a failed import of the image of
// what (`snapshot "ID"`, `sandbox "ID"`) from root.
func (s *Snapshots) ImportError(what, root string, err error) error {
	s.log.Error("importing an image", "of", what, "root", root, "err", err)
	switch {
	case errors.Is(err, errdefs.ErrCorrupt):
		return errdefs.New(errdefs.ErrCorrupt, "%s: its image in the chunk store failed verification (corrupt data); it will not be restored", what)
	case errors.Is(err, errdefs.ErrUnavailable):
		return errdefs.New(errdefs.ErrUnavailable, "%s: the chunk store holding its image does not answer; try again later", what)
	case errors.Is(err, errdefs.ErrNotFound):
		return errdefs.New(errdefs.ErrFailedPrecondition, "%s: its image is not on this host and its manifest is not in the chunk store", what)
	}
	return fmt.Errorf("importing the image of %s: %w", what, err)
}

// Remember has the store note a local image that stays (a template's warm
// image), in the background: it reads and hashes the image once per
// daemon.
func (s *Snapshots) Remember(image string) {
	if s.images == nil || s.bg.Err() != nil {
		return
	}
	s.loops.Go(func() {
		t0 := time.Now()
		if err := s.images.Remember(s.bg, image); err != nil {
			if s.bg.Err() == nil {
				s.log.Warn("noting a warm image for imports", "image", image, "err", err)
			}
			return
		}
		s.log.Debug("warm image noted for imports", "image", image, "ms", time.Since(t0).Milliseconds())
	})
}

// forgetStored drops a deleted snapshot's manifest from the store, off
// the request path (if that fails, the collector drops it after its grace
// period: it is no longer live).
func (s *Snapshots) forgetStored(sn *sandbox.Snapshot) {
	if s.images == nil {
		return
	}
	s.up.mu.Lock()
	delete(s.up.imports, sn.ID)
	s.up.mu.Unlock()
	if sn.StoreRoot == "" {
		return
	}
	s.loops.Go(func() {
		ctx, cancel := context.WithTimeout(s.bg, time.Minute)
		defer cancel()
		if err := s.images.Delete(ctx, sn.StoreRoot); err != nil {
			s.log.Warn("deleting a snapshot's manifest", "snapshot.id", sn.ID, "root", sn.StoreRoot, "err", err)
		}
	})
}
