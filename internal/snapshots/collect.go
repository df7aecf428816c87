package snapshots

import (
	"context"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// collectLoop runs a collection every GCInterval until Close.
func (s *Snapshots) collectLoop() {
	t := time.NewTicker(s.cfg.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		if _, err := s.CollectStore(s.bg); err != nil && s.bg.Err() == nil {
			s.log.Warn("collecting the chunk store", "err", err)
		}
	}
}

// CollectStore runs one collection of the chunk store: what no snapshot
// or paused sandbox names (and is older than GCGrace) is deleted. In a
// cluster the store is shared: what names an image is the cluster's rows
// (with this host's records, in case its rows lag), and one host collects
// each round. It returns the bytes freed.
func (s *Snapshots) CollectStore(ctx context.Context) (int64, error) {
	if s.images == nil {
		return 0, nil
	}
	// The grace counts from before the roots are read: what is written
	// after the read is younger than it.
	read := time.Now()
	var live []string
	if s.cluster != nil {
		roots, ok, err := s.cluster.StoreRoots(ctx, s.cfg.GCInterval)
		if err != nil || !ok {
			return 0, err // never collect a shared store without its roots
		}
		live = roots
	}
	live, err := s.localRoots(ctx, live)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	freed, err := s.images.GC(ctx, live, s.cfg.GCGrace+time.Since(read))
	if err != nil {
		return 0, err
	}
	if freed > 0 {
		s.log.Info("chunk store collected", "freed_bytes", freed, "live", len(live), "ms", time.Since(t0).Milliseconds())
	}
	return freed, nil
}

// localRoots adds to live the roots this host's records name, read
// between uploads (a Job holds exclusive from its start to its record's
// update). Only the read: an upload that starts after it writes its
// manifest after the collection's call, which its grace period keeps, and
// the chunk store itself keeps the chunks such an upload found present
// (chunkstore.Store.GC); so uploads go on while a long collection runs.
func (s *Snapshots) localRoots(ctx context.Context, live []string) ([]string, error) {
	s.up.exclusive.Lock()
	defer s.up.exclusive.Unlock()
	all, err := s.st.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, sn := range all {
		if sn.StoreRoot != "" {
			live = append(live, sn.StoreRoot)
		}
	}
	recs, err := s.st.List(ctx)
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

// RecheckRoots uploads again the images of this host's snapshots whose
// manifest the chunk store no longer holds (a host away for longer than
// the store's grace period may hold a root its rows never named, which
// the cluster's collection then deleted; the image is still on this
// host's disk, and an export of it writes the same root again). An error
// is the store's or the records': the caller retries.
func (s *Snapshots) RecheckRoots(ctx context.Context) error {
	if s.images == nil {
		return nil
	}
	sns, err := s.st.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	for _, sn := range sns {
		if sn.Upload != sandbox.UploadDone || sn.StoreRoot == "" {
			continue
		}
		ok, err := s.images.Has(ctx, sn.StoreRoot)
		if err != nil {
			return err
		}
		if ok {
			continue
		}
		err = s.setUpload(ctx, sn.ID, func(o *sandbox.Snapshot) {
			if o.StoreRoot == sn.StoreRoot {
				o.Upload, o.StoreRoot = sandbox.UploadPending, ""
			}
		})
		if err != nil {
			continue // deleted meanwhile
		}
		s.log.Warn("a snapshot's image was missing from the chunk store; uploading it again", "snapshot.id", sn.ID, "root", sn.StoreRoot)
		s.queueUpload(sn.ID)
	}
	return nil
}
