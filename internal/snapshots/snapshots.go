// Package snapshots keeps a host's snapshots: their records (names, the
// tree of snapshots taken of snapshots, disk use and its cap) and their
// images, in the data directory and beyond it in the chunk store (uploads
// retried in the background, imports before a restore, collection). The
// upload queue also carries other images' uploads (a paused sandbox's: the
// manager's Jobs). It knows no sandbox's state: the manager takes the
// checkpoints and re-bases the sandboxes; this package depends on the box
// factory (which reads and deletes images) and the record store only.
package snapshots

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
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

// Cluster is what the other hosts of a cluster share of their snapshots
// and the chunk store (internal/clusterhost).
type Cluster interface {
	// FindSnapshot returns the record of a snapshot of team that another
	// host took, by id or name: ErrNotFound if there is none.
	FindSnapshot(ctx context.Context, team, idOrName string) (*sandbox.Snapshot, error)
	// StoreRoots claims this round of the shared chunk store's collection
	// (one host collects each round, every so often) and returns the
	// roots the cluster keeps: its snapshots' and paused sandboxes'
	// images. ok is false when the round is another host's.
	StoreRoots(ctx context.Context, every time.Duration) (roots []string, ok bool, err error)
}

// Config is the snapshots' part of the manager's configuration.
type Config struct {
	DataDir string // images in DataDir/snapshots, imports in DataDir/imports
	// RuntimeBuild is what restores only images it wrote (manager.Config).
	RuntimeBuild string
	// CapBytes refuses new snapshots once their images use this much disk
	// (0: no cap).
	CapBytes int64
	// GCInterval is how often the chunk store is collected (0: never);
	// GCGrace is how old what no image names must be before a collection
	// deletes it.
	GCInterval time.Duration
	GCGrace    time.Duration
	// LocalRoot, if set, maps the root file system another host's
	// snapshot names to this host's copy of it (a custom template's root
	// is at another path on each host; manager.CustomTemplates.LocalRoot).
	LocalRoot func(ctx context.Context, team, rootfs string) (string, error)
}

// Snapshots is a host's snapshots. Images and Cluster may be nil (no chunk
// store; a single host). Safe for concurrent use.
//
// Lock order (a lock may be taken while holding only those above it):
//
//	uploads.exclusive (held by a Job, and by a collection reading roots)
//	  (the manager's Live.op)
//	    an import's lock (Lock)
//	      mu
type Snapshots struct {
	cfg     Config
	st      sandbox.Store
	boxes   *box.Factory
	images  ImageStore
	cluster Cluster
	log     *slog.Logger

	mu sync.Mutex // serializes the writers of snapshot records (names, tree, uploads)
	up uploads
	// bg is the background work's context (uploads, collections,
	// deletes), cancelled by Close.
	bg      context.Context
	cancel  context.CancelFunc
	closing chan struct{}
	loops   sync.WaitGroup
}

// New returns the host's snapshots; Start starts their uploads.
func New(cfg Config, st sandbox.Store, boxes *box.Factory, images ImageStore, cluster Cluster, log *slog.Logger) *Snapshots {
	bg, cancel := context.WithCancel(context.Background())
	return &Snapshots{cfg: cfg, st: st, boxes: boxes, images: images, cluster: cluster, log: log,
		up: uploads{imports: map[string]*sync.Mutex{}, wake: make(chan struct{}, 1)}, bg: bg, cancel: cancel, closing: make(chan struct{})}
}

// Close stops the background work (an upload under way is resumed by the
// next daemon) and waits for it.
func (s *Snapshots) Close() {
	close(s.closing)
	s.cancel()
	s.loops.Wait()
}

// Dir is where snapshot id's image is.
func (s *Snapshots) Dir(id string) string { return filepath.Join(s.cfg.DataDir, "snapshots", id) }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

// CheckName refuses names that are malformed or would be shadowed by a
// built-in template or a route. (A name in use is not refused: it moves to
// the new snapshot, see Add.)
func CheckName(name string) error {
	if name == "" {
		return nil
	}
	if !nameRE.MatchString(name) {
		return errdefs.New(errdefs.ErrInvalidArgument, "snapshot name must be 1-128 characters of letters, digits and ._:/-")
	}
	if _, err := template.Resolve(name); err == nil || name == "usage" {
		return errdefs.New(errdefs.ErrInvalidArgument, "snapshot name %q is reserved", name)
	}
	return nil
}

// Find looks a snapshot of the request's team up by id, then by name.
func (s *Snapshots) Find(ctx context.Context, idOrName string) (*sandbox.Snapshot, error) {
	if sn, err := s.st.GetSnapshot(ctx, idOrName); err == nil && sandbox.Sees(ctx, sn.Team) {
		return sn, nil
	}
	all, err := s.st.ListSnapshots(ctx)
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

// Source looks up a snapshot to start a sandbox from (create, rollback):
// this host's, else, in a cluster, one another host took and uploaded to
// the chunk store. Such a snapshot has no Image: Image imports it for each
// use.
func (s *Snapshots) Source(ctx context.Context, idOrName string) (*sandbox.Snapshot, error) {
	sn, err := s.Find(ctx, idOrName)
	if err == nil || s.cluster == nil || s.images == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return sn, err
	}
	team, _ := sandbox.TeamOf(ctx)
	if sn, err = s.cluster.FindSnapshot(ctx, team, idOrName); err != nil {
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
	case sn.Runtime != s.cfg.RuntimeBuild:
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "snapshot %q was written by runtime build %q; this host runs %q", sn.ID, sn.Runtime, s.cfg.RuntimeBuild)
	}
	if s.cfg.LocalRoot != nil {
		if sn.Rootfs, err = s.cfg.LocalRoot(ctx, sn.Team, sn.Rootfs); err != nil {
			return nil, fmt.Errorf("snapshot %q: %w", sn.ID, err)
		}
	}
	if _, err := os.Stat(sn.Rootfs); err != nil {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "snapshot %q: its template's root filesystem (%s) is not on this host", sn.ID, sn.Rootfs)
	}
	sn.Image = ""
	return sn, nil
}

// List returns every snapshot (of the request's team), oldest first.
func (s *Snapshots) List(ctx context.Context) ([]*sandbox.Snapshot, error) {
	all, err := s.st.ListSnapshots(ctx)
	all = slices.DeleteFunc(all, func(sn *sandbox.Snapshot) bool { return !sandbox.Sees(ctx, sn.Team) })
	slices.SortFunc(all, func(a, b *sandbox.Snapshot) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return all, err
}

// Usage returns the disk snapshot images use and the cap.
func (s *Snapshots) Usage(ctx context.Context) (sandbox.SnapshotUsage, error) {
	all, err := s.st.ListSnapshots(ctx)
	u := sandbox.SnapshotUsage{CapBytes: s.cfg.CapBytes, Count: len(all), Uploads: map[sandbox.UploadState]int{}}
	for _, sn := range all {
		u.TotalBytes += sn.SizeBytes
		if sn.Upload != "" {
			u.Uploads[sn.Upload]++
		}
	}
	return u, err
}

// CheckRoom refuses a new image when snapshots reach the cap or the disk
// is nearly full.
func (s *Snapshots) CheckRoom(ctx context.Context) error {
	u, err := s.Usage(ctx)
	if err != nil {
		return err
	}
	if u.CapBytes > 0 && u.TotalBytes >= u.CapBytes {
		return errdefs.New(errdefs.ErrResourceExhausted, "snapshot disk cap reached: %d MiB used of %d MiB; delete snapshots first", u.TotalBytes>>20, u.CapBytes>>20)
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(s.cfg.DataDir, &fs); err == nil && int64(fs.Bavail)*fs.Bsize < 1<<30 {
		return errdefs.New(errdefs.ErrResourceExhausted, "less than 1 GiB free on the data disk; delete snapshots first")
	}
	return nil
}

// Add records a new snapshot, whose image is in Dir(sn.ID), and queues its
// upload. A name moves to the newest snapshot that takes it (as E2B's
// named snapshots do: the older one stays, reachable by id); a parent
// deleted meanwhile is dropped.
func (s *Snapshots) Add(ctx context.Context, sn *sandbox.Snapshot) error {
	if s.images != nil {
		sn.Upload = sandbox.UploadPending
	}
	if err := s.record(ctx, sn); err != nil {
		return err
	}
	if s.images != nil {
		s.queueUpload(sn.ID) // off the request path: the image is safe on disk
	}
	return nil
}

func (s *Snapshots) record(ctx context.Context, sn *sandbox.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(sn.Names) > 0 {
		if old, err := s.Find(ctx, sn.Names[0]); err == nil {
			old.Names = slices.DeleteFunc(old.Names, func(n string) bool { return n == sn.Names[0] })
			if err := s.st.PutSnapshot(ctx, old); err != nil {
				return err
			}
		}
	}
	if sn.ParentID != "" {
		if _, err := s.st.GetSnapshot(ctx, sn.ParentID); err != nil {
			sn.ParentID = ""
		}
	}
	return s.st.PutSnapshot(ctx, sn)
}

// Delete removes a snapshot's record, moving its children in the tree up
// to its parent, and returns it; its image goes once no restore reads it,
// its manifest in the chunk store off the request path (the caller
// re-bases the sandboxes based on it).
func (s *Snapshots) Delete(ctx context.Context, idOrName string) (*sandbox.Snapshot, error) {
	sn, err := s.unrecord(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	s.boxes.RemoveImage(sn.Image)
	s.forgetStored(sn)
	return sn, nil
}

func (s *Snapshots) unrecord(ctx context.Context, idOrName string) (*sandbox.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, err := s.Find(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	all, err := s.st.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, c := range all {
		if c.ParentID == sn.ID {
			c.ParentID = sn.ParentID
			if err := s.st.PutSnapshot(ctx, c); err != nil {
				return nil, err
			}
		}
	}
	if err := s.st.DeleteSnapshot(ctx, sn.ID); err != nil {
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

// InTree reports whether sn belongs to the snapshot tree of sandbox id
// whose state came from snapshot base (""): the tree of base, or of
// snapshots taken of the sandbox.
func (s *Snapshots) InTree(ctx context.Context, id, base string, sn *sandbox.Snapshot) (bool, error) {
	all, err := s.st.ListSnapshots(ctx)
	if err != nil {
		return false, err
	}
	byID := map[string]*sandbox.Snapshot{sn.ID: sn} // sn may be another host's
	for _, o := range all {
		byID[o.ID] = o
	}
	root := treeRoot(byID, sn.ID)
	if base != "" && treeRoot(byID, base) == root {
		return true, nil
	}
	for _, o := range all {
		if o.SandboxID == id && treeRoot(byID, o.ID) == root {
			return true, nil
		}
	}
	return false, nil
}

// Hold keeps sn's image on disk until the returned func is called, and
// checks sn was not deleted before the hold took (Delete drops the record
// before the image). Another host's snapshot (no Image) needs no hold: its
// import is the restore's own.
func (s *Snapshots) Hold(ctx context.Context, sn *sandbox.Snapshot) (func(), error) {
	if sn.Image == "" {
		return func() {}, nil
	}
	release := s.boxes.HoldImage(sn.Image)
	if _, err := s.st.GetSnapshot(ctx, sn.ID); err != nil {
		release()
		return nil, errdefs.New(errdefs.ErrNotFound, "snapshot %q not found", sn.ID)
	}
	return release, nil
}

// uploadMeta is the metadata a snapshot's image is exported with: an
// offer of the image to a peer (Offer) must encode the same, so that its
// manifest's root is the one the upload writes.
func (s *Snapshots) uploadMeta(sn *sandbox.Snapshot) map[string]string {
	return map[string]string{"snapshot": sn.ID, "template": sn.TemplateID, "runsc": s.cfg.RuntimeBuild}
}

// Offer returns the image directory of this host's snapshot id (of the
// context's team) and the metadata its upload exports it with: a cluster
// host offers it to the host of a fork child made elsewhere, before the
// upload. FailedPrecondition when its image is not on this host (it went,
// to be imported back from the store).
func (s *Snapshots) Offer(ctx context.Context, id string) (string, map[string]string, error) {
	sn, err := s.Find(ctx, id)
	if err != nil {
		return "", nil, err
	}
	if sn.Image == "" || !box.Complete(sn.Image) {
		return "", nil, errdefs.New(errdefs.ErrFailedPrecondition, "snapshot %q: its image is not on this host", id)
	}
	return sn.Image, s.uploadMeta(sn), nil
}

// Reconcile drops records whose image is gone (unless the chunk store
// holds it: it is imported when used) and images (or half-written or
// half-imported ones) without a record.
func (s *Snapshots) Reconcile(ctx context.Context) error {
	all, err := s.st.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, sn := range all {
		if !box.Complete(sn.Image) && s.images != nil && sn.Upload == sandbox.UploadDone {
			continue
		}
		if !box.Complete(sn.Image) {
			s.log.Warn("removing snapshot whose image is gone", "snapshot.id", sn.ID)
			_ = s.st.DeleteSnapshot(ctx, sn.ID)
			continue
		}
		keep[sn.Image] = true
	}
	dir := filepath.Join(s.cfg.DataDir, "snapshots")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if p := filepath.Join(dir, e.Name()); !keep[p] {
			_ = os.RemoveAll(p)
		}
	}
	return nil
}
