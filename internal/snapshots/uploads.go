package snapshots

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// uploads is the queue of images to export (one export at a time, by one
// goroutine) and the imports under way. Safe for concurrent use.
type uploads struct {
	// exclusive is held by a Job from its start to its record's update,
	// and by a collection while it reads the records' roots: a manifest
	// that was just written is never collected before a record names it.
	exclusive sync.Mutex

	mu      sync.Mutex
	queue   []Job                  // guarded by mu: oldest first
	imports map[string]*sync.Mutex // guarded by mu: per key (Lock)
	wake    chan struct{}          // a send (non-blocking) says the queue grew
}

// A Job is one image's upload. Try makes one attempt, holding the lock a
// collection reads the records' roots under, so that it records the root
// it wrote before a collection can miss it; done reports that no other
// attempt is needed (uploaded, gone, or refused for good).
type Job struct {
	What, ID string // for the log: "paused sandbox", its id
	Try      func(ctx context.Context) (done bool, err error)
}

// Queue adds an upload to the queue: jobs run one at a time, retried with
// backoff until done or Close.
func (s *Snapshots) Queue(j Job) {
	s.up.mu.Lock()
	s.up.queue = append(s.up.queue, j)
	s.up.mu.Unlock()
	select {
	case s.up.wake <- struct{}{}:
	default:
	}
}

// queueUpload queues the upload of snapshot id's image.
func (s *Snapshots) queueUpload(id string) {
	s.Queue(Job{What: "snapshot", ID: id, Try: func(ctx context.Context) (bool, error) { return s.uploadOnce(ctx, id) }})
}

// pop takes the next queued job, if any.
func (u *uploads) pop() (Job, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.queue) == 0 {
		return Job{}, false
	}
	j := u.queue[0]
	u.queue = u.queue[1:]
	return j, true
}

// uploadBackoff bounds the wait between two attempts of one upload.
const (
	uploadBackoffMin = time.Second
	uploadBackoffMax = 5 * time.Minute
)

// Start resumes the uploads a previous daemon left (and uploads the
// snapshots taken before the store was configured), then runs the
// uploader and the collector. Without a chunk store it does nothing.
func (s *Snapshots) Start(ctx context.Context) {
	if s.images == nil {
		return
	}
	os.RemoveAll(s.importsDir()) // a previous daemon's, restored or not
	all, err := s.st.ListSnapshots(ctx)
	if err != nil {
		s.log.Error("listing snapshots to upload", "err", err)
	}
	for _, sn := range all {
		switch sn.Upload {
		case "":
			if err := s.setUpload(ctx, sn.ID, func(o *sandbox.Snapshot) { o.Upload = sandbox.UploadPending }); err != nil {
				s.log.Warn("queueing snapshot upload", "snapshot.id", sn.ID, "err", err)
				continue
			}
			fallthrough
		case sandbox.UploadPending:
			s.queueUpload(sn.ID)
		}
	}
	s.loops.Go(s.uploadLoop)
	if s.cfg.GCInterval > 0 {
		s.loops.Go(s.collectLoop)
	}
}

// uploadLoop runs queued jobs, one at a time, until Close.
func (s *Snapshots) uploadLoop() {
	for s.bg.Err() == nil {
		j, ok := s.up.pop()
		if !ok {
			select {
			case <-s.closing:
				return
			case <-s.up.wake:
				continue
			}
		}
		s.upload(j)
	}
}

// upload runs a job, retrying with backoff until it is done or Close.
func (s *Snapshots) upload(j Job) {
	wait := uploadBackoffMin
	for attempt := 1; ; attempt++ {
		s.up.exclusive.Lock()
		done, err := j.Try(s.bg)
		s.up.exclusive.Unlock()
		if done {
			return
		}
		s.log.Warn("uploading an image failed; retrying", "of", j.What, "id", j.ID, "attempt", attempt, "in", wait.String(), "err", err)
		select {
		case <-s.closing:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, uploadBackoffMax)
	}
}

// uploadOnce makes one attempt at snapshot id's upload.
func (s *Snapshots) uploadOnce(ctx context.Context, id string) (done bool, err error) {
	sn, err := s.st.GetSnapshot(ctx, id)
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
	root, uploaded, err := s.images.Export(ctx, sn.Image, s.uploadMeta(sn))
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return true, nil // closing: the next daemon resumes it
	case errors.Is(err, errdefs.ErrCorrupt), errors.Is(err, errdefs.ErrNotFound):
		if _, gone := s.st.GetSnapshot(ctx, id); gone != nil {
			return true, nil // its image went with it
		}
		s.log.Error("uploading snapshot failed for good", "snapshot.id", id, "err", err)
		reason := "its image is corrupt"
		if errors.Is(err, errdefs.ErrNotFound) {
			reason = "its image is gone from this host"
		}
		return true, s.setUpload(ctx, id, func(o *sandbox.Snapshot) { o.Upload, o.UploadError = sandbox.UploadFailed, reason })
	default:
		if _, gone := s.st.GetSnapshot(ctx, id); errors.Is(gone, errdefs.ErrNotFound) {
			return true, nil // deleted while it was exported: its files went mid-read
		}
		return false, err
	}
	err = s.setUpload(ctx, id, func(o *sandbox.Snapshot) { o.Upload, o.StoreRoot, o.UploadError = sandbox.UploadDone, root, "" })
	if errors.Is(err, errdefs.ErrNotFound) {
		// Deleted while it was exported: its manifest goes too.
		if err := s.images.Delete(ctx, root); err != nil {
			s.log.Warn("deleting the manifest of a deleted snapshot", "snapshot.id", id, "err", err)
		}
		return true, nil
	}
	if err != nil {
		return false, err
	}
	s.log.Info("snapshot uploaded", "snapshot.id", id, "root", root, "uploaded_bytes", uploaded, "ms", time.Since(t0).Milliseconds())
	return true, nil
}

// setUpload changes a snapshot's upload fields (under mu, which every
// writer of snapshot records holds); ErrNotFound if it is gone.
func (s *Snapshots) setUpload(ctx context.Context, id string, change func(*sandbox.Snapshot)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, err := s.st.GetSnapshot(ctx, id)
	if err != nil {
		return err
	}
	change(sn)
	return s.st.PutSnapshot(ctx, sn)
}
