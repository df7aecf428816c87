package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// ImageStore keeps snapshot images beyond this host's data directory: the
// chunk store (internal/chunkstore, adapted by the daemon). A snapshot's
// image is exported after the snapshot is answered (off the request path,
// retried until it succeeds), its manifest root recorded on the snapshot;
// a snapshot whose image directory is gone is imported back from that root
// before it is restored. Implementations are safe for concurrent use.
type ImageStore interface {
	// Export stores the image directory dir and returns the root naming
	// its manifest and the bytes it had to upload. An error of class
	// errdefs.ErrCorrupt is terminal; any other may pass on a retry.
	Export(ctx context.Context, dir string, meta map[string]string) (root string, uploaded int64, err error)
	// Import rebuilds the image root names into dir, which must not exist
	// (its parent must), verifying every byte: a chunk that fails is
	// errdefs.ErrCorrupt and nothing is left at dir. It returns the bytes
	// it fetched from the store.
	Import(ctx context.Context, root, dir string) (fetched int64, err error)
	// Delete removes a manifest; its chunks stay until GC.
	Delete(ctx context.Context, root string) error
	// GC deletes the manifests not in live and the chunks no kept
	// manifest names, older than grace, and returns the bytes freed.
	GC(ctx context.Context, live []string, grace time.Duration) (freed int64, err error)
	// Remember notes the files of a local image directory that stays (a
	// template's warm image): imports of images sharing their bytes read
	// them here rather than from the store.
	Remember(ctx context.Context, dir string) error
	// Has reports whether the store holds the manifest root names.
	Has(ctx context.Context, root string) (bool, error)
}

// remember has the store note a template's warm image, in the background
// (it reads and hashes the image once per daemon).
func (m *Manager) remember(image string) {
	if m.images == nil || m.bg.Err() != nil {
		return
	}
	m.loops.Go(func() {
		t0 := time.Now()
		if err := m.images.Remember(m.bg, image); err != nil {
			if m.bg.Err() == nil {
				m.log.Warn("noting a warm image for imports", "image", image, "err", err)
			}
			return
		}
		m.log.Debug("warm image noted for imports", "image", image, "ms", time.Since(t0).Milliseconds())
	})
}

// uploads is the manager's side of its ImageStore: the queue of snapshots
// to export (one export at a time, by one goroutine) and the imports under
// way. Safe for concurrent use.
type uploads struct {
	// exclusive is held by an export from its start to its record's
	// update, and by a collection while it reads the records' roots: a
	// manifest that was just written is never collected before the
	// snapshot names it.
	exclusive sync.Mutex

	mu      sync.Mutex
	queue   []string               // guarded by mu: snapshot ids, oldest first
	imports map[string]*sync.Mutex // guarded by mu: per snapshot id
	wake    chan struct{}          // a send (non-blocking) says the queue grew
}

func newUploads() *uploads {
	return &uploads{imports: map[string]*sync.Mutex{}, wake: make(chan struct{}, 1)}
}

// push queues a snapshot's upload.
func (u *uploads) push(id string) {
	u.mu.Lock()
	u.queue = append(u.queue, id)
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// pop takes the next queued snapshot, if any.
func (u *uploads) pop() (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.queue) == 0 {
		return "", false
	}
	id := u.queue[0]
	u.queue = u.queue[1:]
	return id, true
}

// importLock returns the lock that serializes the imports of snapshot id.
func (u *uploads) importLock(id string) *sync.Mutex {
	u.mu.Lock()
	defer u.mu.Unlock()
	l := u.imports[id]
	if l == nil {
		l = &sync.Mutex{}
		u.imports[id] = l
	}
	return l
}

func (u *uploads) forget(id string) {
	u.mu.Lock()
	delete(u.imports, id)
	u.mu.Unlock()
}

// uploadBackoff bounds the wait between two attempts of one upload.
const (
	uploadBackoffMin = time.Second
	uploadBackoffMax = 5 * time.Minute
)

// startImages resumes the uploads a previous daemon left (and uploads the
// snapshots taken before the store was configured), then runs the uploader
// and the collector.
func (m *Manager) startImages(ctx context.Context) {
	if m.images == nil {
		return
	}
	os.RemoveAll(m.importsDir()) // a previous daemon's, restored or not
	m.requeuePausedUploads(ctx)
	all, err := m.st.ListSnapshots(ctx)
	if err != nil {
		m.log.Error("listing snapshots to upload", "err", err)
	}
	for _, sn := range all {
		switch sn.Upload {
		case "":
			if err := m.setUpload(ctx, sn.ID, func(s *sandbox.Snapshot) { s.Upload = sandbox.UploadPending }); err != nil {
				m.log.Warn("queueing snapshot upload", "snapshot.id", sn.ID, "err", err)
				continue
			}
			fallthrough
		case sandbox.UploadPending:
			m.up.push(sn.ID)
		}
	}
	m.loops.Go(m.uploadLoop)
	if m.cfg.StoreGCInterval > 0 {
		m.loops.Go(m.collectLoop)
	}
}

// uploadLoop exports queued snapshots, one at a time, until Close.
func (m *Manager) uploadLoop() {
	for m.bg.Err() == nil {
		id, ok := m.up.pop()
		if !ok {
			select {
			case <-m.closing:
				return
			case <-m.up.wake:
				continue
			}
		}
		m.upload(id)
	}
}

// upload exports a queued image (a snapshot's, or a paused sandbox's:
// travel.go), retrying with backoff until it is uploaded, fails for good,
// is deleted, or the manager closes.
func (m *Manager) upload(entry string) {
	id, upload, what := entry, m.uploadOnce, "snapshot"
	if sb, ok := isPausedUpload(entry); ok {
		id, upload, what = sb, m.uploadPausedOnce, "paused sandbox"
	}
	wait := uploadBackoffMin
	for attempt := 1; ; attempt++ {
		done, err := upload(m.bg, id)
		if done {
			return
		}
		m.log.Warn("uploading an image failed; retrying", "of", what, "id", id, "attempt", attempt, "in", wait.String(), "err", err)
		select {
		case <-m.closing:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, uploadBackoffMax)
	}
}

// uploadOnce makes one attempt; done reports that no other is needed.
func (m *Manager) uploadOnce(ctx context.Context, id string) (done bool, err error) {
	m.up.exclusive.Lock()
	defer m.up.exclusive.Unlock()
	sn, err := m.st.GetSnapshot(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return true, nil // deleted meanwhile
	}
	if err != nil {
		return false, err
	}
	if sn.Upload != sandbox.UploadPending {
		return true, nil
	}
	t0 := time.Now()
	root, uploaded, err := m.images.Export(ctx, sn.Image, m.uploadMeta(sn))
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return true, nil // closing: the next daemon resumes it
	case errors.Is(err, errdefs.ErrCorrupt), errors.Is(err, errdefs.ErrNotFound):
		if _, gone := m.st.GetSnapshot(ctx, id); gone != nil {
			return true, nil // its image went with it
		}
		m.log.Error("uploading snapshot failed for good", "snapshot.id", id, "err", err)
		reason := "its image is corrupt"
		if errors.Is(err, errdefs.ErrNotFound) {
			reason = "its image is gone from this host"
		}
		return true, m.setUpload(ctx, id, func(s *sandbox.Snapshot) { s.Upload, s.UploadError = sandbox.UploadFailed, reason })
	default:
		if _, gone := m.st.GetSnapshot(ctx, id); errors.Is(gone, errdefs.ErrNotFound) {
			return true, nil // deleted while it was exported: its files went mid-read
		}
		return false, err
	}
	err = m.setUpload(ctx, id, func(s *sandbox.Snapshot) { s.Upload, s.StoreRoot, s.UploadError = sandbox.UploadDone, root, "" })
	if errors.Is(err, errdefs.ErrNotFound) {
		// Deleted while it was exported: its manifest goes too.
		if err := m.images.Delete(ctx, root); err != nil {
			m.log.Warn("deleting the manifest of a deleted snapshot", "snapshot.id", id, "err", err)
		}
		return true, nil
	}
	if err != nil {
		return false, err
	}
	m.log.Info("snapshot uploaded", "snapshot.id", id, "root", root, "uploaded_bytes", uploaded, "ms", time.Since(t0).Milliseconds())
	return true, nil
}

// setUpload changes a snapshot's upload fields (under snap, which every
// writer of snapshot records holds); ErrNotFound if it is gone.
func (m *Manager) setUpload(ctx context.Context, id string, change func(*sandbox.Snapshot)) error {
	m.snap.Lock()
	defer m.snap.Unlock()
	sn, err := m.st.GetSnapshot(ctx, id)
	if err != nil {
		return err
	}
	change(sn)
	return m.st.PutSnapshot(ctx, sn)
}

// importsDir holds the images of other hosts' snapshots while they are
// restored (imageOf): emptied at start.
func (m *Manager) importsDir() string { return filepath.Join(m.cfg.DataDir, "imports") }

// imageOf returns the image directory to restore sn from and a func to
// call once the restore is done. A snapshot of this host restores from its
// own image, imported back from the store first if this host lost it
// (ensureImage). Another host's (findSource: no Image) is imported into a
// directory of its own for this restore, which done deletes: the restored
// sandbox keeps the pages it maps, and its own checkpoints keep copies.
func (m *Manager) imageOf(ctx context.Context, sn *sandbox.Snapshot) (string, func(), error) {
	if sn.Image != "" {
		return sn.Image, func() {}, m.ensureImage(ctx, sn)
	}
	if err := os.MkdirAll(m.importsDir(), 0o700); err != nil {
		return "", nil, err
	}
	dir := filepath.Join(m.importsDir(), sn.ID+"-"+sandbox.RandomHex(4))
	t0 := time.Now()
	fetched, err := m.images.Import(ctx, sn.StoreRoot, dir)
	timing.Since(ctx, "import", t0)
	if err != nil {
		return "", nil, m.importError(fmt.Sprintf("snapshot %q", sn.ID), sn.StoreRoot, err)
	}
	m.log.Info("snapshot of another host imported", "snapshot.id", sn.ID, "fetched_bytes", fetched, "ms", time.Since(t0).Milliseconds())
	return dir, func() { m.boxes.RemoveImage(dir) }, nil
}

// ensureImage puts a snapshot's image back in its place from the store
// when the directory is gone (a host that lost it), verified, before a
// restore reads it (phase "import" in Server-Timing).
func (m *Manager) ensureImage(ctx context.Context, sn *sandbox.Snapshot) error {
	if m.images == nil || complete(sn.Image) {
		return nil
	}
	if sn.Upload != sandbox.UploadDone || sn.StoreRoot == "" {
		return errdefs.New(errdefs.ErrFailedPrecondition, "snapshot %q: its image is not on this host and was not uploaded to the chunk store", sn.ID)
	}
	lock := m.up.importLock(sn.ID)
	lock.Lock()
	defer lock.Unlock()
	if complete(sn.Image) {
		return nil // imported by another restore meanwhile
	}
	if err := os.MkdirAll(filepath.Dir(sn.Image), 0o700); err != nil {
		return err
	}
	t0 := time.Now()
	fetched, err := m.images.Import(ctx, sn.StoreRoot, sn.Image)
	timing.Since(ctx, "import", t0)
	if err != nil {
		return m.importError(fmt.Sprintf("snapshot %q", sn.ID), sn.StoreRoot, err)
	}
	// Deleted while it was imported: its image must not stay behind.
	if _, err := m.st.GetSnapshot(ctx, sn.ID); err != nil {
		m.boxes.RemoveImage(sn.Image)
		return errdefs.New(errdefs.ErrNotFound, "snapshot %q not found", sn.ID)
	}
	m.log.Info("snapshot imported", "snapshot.id", sn.ID, "fetched_bytes", fetched, "ms", time.Since(t0).Milliseconds())
	return nil
}

// importError is what a caller is told of a failed import of the image
// of what (`snapshot "ID"`, `sandbox "ID"`) from root.
func (m *Manager) importError(what, root string, err error) error {
	m.log.Error("importing an image", "of", what, "root", root, "err", err)
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

// forgetStored drops a deleted snapshot's manifest from the store, off
// the request path (if that fails, the collector drops it after its grace
// period: it is no longer live).
func (m *Manager) forgetStored(sn *sandbox.Snapshot) {
	if m.images == nil {
		return
	}
	m.up.forget(sn.ID)
	if sn.StoreRoot == "" {
		return
	}
	m.loops.Go(func() {
		ctx, cancel := context.WithTimeout(m.bg, time.Minute)
		defer cancel()
		if err := m.images.Delete(ctx, sn.StoreRoot); err != nil {
			m.log.Warn("deleting a snapshot's manifest", "snapshot.id", sn.ID, "root", sn.StoreRoot, "err", err)
		}
	})
}

// collectLoop runs a collection every StoreGCInterval until Close.
func (m *Manager) collectLoop() {
	t := time.NewTicker(m.cfg.StoreGCInterval)
	defer t.Stop()
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
		}
		if _, err := m.CollectStore(m.bg); err != nil && m.bg.Err() == nil {
			m.log.Warn("collecting the chunk store", "err", err)
		}
	}
}

// CollectStore runs one collection of the chunk store: what no snapshot
// or paused sandbox names (and is older than StoreGCGrace) is deleted. In
// a cluster the store is shared: what names an image is the cluster's rows
// (with this host's records, in case its rows lag), and one host collects
// each round. It returns the bytes freed.
func (m *Manager) CollectStore(ctx context.Context) (int64, error) {
	if m.images == nil {
		return 0, nil
	}
	// The grace counts from before the roots are read: what is written
	// after the read is younger than it.
	read := time.Now()
	var live []string
	if m.cluster != nil {
		roots, ok, err := m.cluster.StoreRoots(ctx, m.cfg.StoreGCInterval)
		if err != nil || !ok {
			return 0, err // never collect a shared store without its roots
		}
		live = roots
	}
	live, err := m.localRoots(ctx, live)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	freed, err := m.images.GC(ctx, live, m.cfg.StoreGCGrace+time.Since(read))
	if err != nil {
		return 0, err
	}
	if freed > 0 {
		m.log.Info("chunk store collected", "freed_bytes", freed, "live", len(live), "ms", time.Since(t0).Milliseconds())
	}
	return freed, nil
}

// localRoots adds to live the roots this host's records name, read
// between exports (an export holds exclusive from its start to its
// record's update). Only the read: an export that starts after it writes
// its manifest after the collection's call, which its grace period keeps,
// and the chunk store itself keeps the chunks such an export found present
// (chunkstore.Store.GC); so uploads go on while a long collection runs.
func (m *Manager) localRoots(ctx context.Context, live []string) ([]string, error) {
	m.up.exclusive.Lock()
	defer m.up.exclusive.Unlock()
	all, err := m.st.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, sn := range all {
		if sn.StoreRoot != "" {
			live = append(live, sn.StoreRoot)
		}
	}
	recs, err := m.st.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		if rec.PausedRoot != "" {
			live = append(live, rec.PausedRoot)
		}
	}
	return live, nil
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
	for wait := time.Second; ; wait = min(2*wait, uploadBackoffMax) {
		err := m.recheckRoots(ctx)
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

func (m *Manager) recheckRoots(ctx context.Context) error {
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
	sns, err := m.st.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	for _, sn := range sns {
		if sn.Upload != sandbox.UploadDone || sn.StoreRoot == "" {
			continue
		}
		ok, err := m.images.Has(ctx, sn.StoreRoot)
		if err != nil {
			return err
		}
		if ok {
			continue
		}
		err = m.setUpload(ctx, sn.ID, func(s *sandbox.Snapshot) {
			if s.StoreRoot == sn.StoreRoot {
				s.Upload, s.StoreRoot = sandbox.UploadPending, ""
			}
		})
		if err != nil {
			continue // deleted meanwhile
		}
		m.log.Warn("a snapshot's image was missing from the chunk store; uploading it again", "snapshot.id", sn.ID, "root", sn.StoreRoot)
		m.up.push(sn.ID)
	}
	return nil
}
