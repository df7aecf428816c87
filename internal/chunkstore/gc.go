package chunkstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Roots lists the manifests that are live: the single host's snapshots and
// paused sandboxes, the cluster's rows.
type Roots interface {
	LiveRoots(ctx context.Context) ([]Hash, error)
}

// RootsFunc adapts a function to Roots.
type RootsFunc func(ctx context.Context) ([]Hash, error)

func (f RootsFunc) LiveRoots(ctx context.Context) ([]Hash, error) { return f(ctx) }

// GCStats describe one collection.
type GCStats struct {
	Manifests        int // in the store when it started
	LiveManifests    int // kept: live, or younger than the grace period
	MissingLive      int // live roots the store does not hold
	DeletedManifests int
	Dropped          []string // the roots of the manifests it deleted
	Chunks           int      // in the store when it started
	DeletedChunks    int
	Packs            int // pack files in the store when it started
	DeletedPacks     int
	BytesFreed       int64 // chunks' and manifests' bytes
	Duration         time.Duration
}

// GC deletes what no live manifest needs: manifests that are neither live
// nor younger than grace, then chunks and pack files that no kept manifest
// names and that are older than grace (an export under way may have just
// uploaded them). A kept manifest's bases are kept, so a pack lives while
// the manifest that wrote it, or one over that one, is kept.
// It marks without the lock, then takes it exclusively (waiting for
// exports between their existence check and their manifest), marks the
// manifests written meanwhile, and sweeps. One collector runs at a time.
func (s *Store) GC(ctx context.Context, roots Roots, grace time.Duration) (st GCStats, err error) {
	t0 := time.Now()
	defer func() {
		st.Duration = time.Since(t0)
		if err != nil {
			err = fmt.Errorf("collecting garbage in %s: %w", s.b, err)
		}
	}()
	ctx, unlockGC, err := s.locker.Lock(ctx, LockGC, true)
	if err != nil {
		return st, err
	}
	defer unlockGC()
	liveList, err := roots.LiveRoots(ctx)
	if err != nil {
		return st, fmt.Errorf("listing live manifests: %w", err)
	}
	live := make(map[string]bool, len(liveList))
	for _, r := range liveList {
		live[ManifestKey(r)] = true
	}

	// Mark. The grace period counts from the call, not from now: the
	// caller read its live roots before the call, and waiting for another
	// collector's lock must not age what was written after that read.
	cutoff := t0.Add(-grace)
	seen := make(map[string]bool)
	var drop []Object
	var keep []Hash
	if err := s.b.List(ctx, "manifests/", func(o Object) error {
		if seen[o.Key] {
			return nil
		}
		seen[o.Key] = true
		st.Manifests++
		if live[o.Key] || o.Modified.After(cutoff) {
			r, err := ParseHash(strings.TrimPrefix(o.Key, "manifests/"))
			if err != nil {
				return fmt.Errorf("manifest %s: %w", o.Key, err)
			}
			keep = append(keep, r)
		} else {
			drop = append(drop, o)
		}
		return nil
	}); err != nil {
		return st, err
	}
	for k := range live {
		if !seen[k] {
			st.MissingLive++
		}
	}
	marked := make(map[Hash]bool)
	markedPacks := make(map[Hash]bool)
	kept := make(map[Hash]bool) // manifests, with the bases of those kept
	var mu sync.Mutex
	if err := s.mark(ctx, keep, kept, marked, markedPacks, &mu); err != nil {
		return st, err
	}
	var candidates []Object
	chunkSeen := make(map[string]bool)
	if err := s.b.List(ctx, "chunks/", func(o Object) error {
		if chunkSeen[o.Key] {
			return nil
		}
		chunkSeen[o.Key] = true
		st.Chunks++
		h, err := ParseHash(o.Key[strings.LastIndexByte(o.Key, '/')+1:])
		if err != nil || o.Key != ChunkKey(h) {
			return nil // not ours: leave it
		}
		if !marked[h] && o.Modified.Before(cutoff) {
			candidates = append(candidates, o)
		}
		return nil
	}); err != nil {
		return st, err
	}
	var packCandidates []Object
	if err := s.b.List(ctx, "packs/", func(o Object) error {
		if chunkSeen[o.Key] {
			return nil
		}
		chunkSeen[o.Key] = true
		st.Packs++
		id, err := ParseHash(strings.TrimPrefix(o.Key, "packs/"))
		if err != nil || o.Key != PackKey(id) {
			return nil // not ours: leave it
		}
		if !markedPacks[id] && o.Modified.Before(cutoff) {
			packCandidates = append(packCandidates, o)
		}
		return nil
	}); err != nil {
		return st, err
	}

	// Sweep, holding the lock: exports that found a chunk present have
	// written their manifests, and none starts.
	held, unlock, err := s.locker.Lock(ctx, LockStore, true)
	if err != nil {
		return st, err
	}
	defer unlock()
	// Manifests written meanwhile, and dead ones written again (an export
	// of the same image with the same meta and base: the same root).
	dropped := make(map[string]time.Time, len(drop))
	for _, o := range drop {
		dropped[o.Key] = o.Modified
	}
	var late []Hash
	if err := s.b.List(held, "manifests/", func(o Object) error {
		if mod, ok := dropped[o.Key]; !seen[o.Key] || ok && !o.Modified.Equal(mod) {
			seen[o.Key] = true
			delete(dropped, o.Key)
			if r, err := ParseHash(strings.TrimPrefix(o.Key, "manifests/")); err == nil {
				late = append(late, r)
			}
		}
		return nil
	}); err != nil {
		return st, err
	}
	if err := s.mark(held, late, kept, marked, markedPacks, &mu); err != nil {
		return st, err
	}
	st.LiveManifests = len(kept)
	// A manifest that is neither live nor young stays while a kept one is
	// over it.
	drop = slices.DeleteFunc(drop, func(o Object) bool {
		r, err := ParseHash(strings.TrimPrefix(o.Key, "manifests/"))
		return err == nil && kept[r]
	})

	// A new epoch before anything goes: every store's known set is void.
	if err := s.b.Put(held, epochKey, []byte(randomHex(16))); err != nil {
		return st, fmt.Errorf("writing the collection epoch: %w", err)
	}

	// Manifests first: a collection cut short leaves chunks no manifest
	// names, never a manifest that names a missing chunk.
	var freed atomic.Int64
	var deleted atomic.Int64
	sweep := func(objs []Object, skip func(Object) bool) error {
		deleted.Store(0)
		g, gctx := errgroup.WithContext(held)
		g.SetLimit(s.parallel)
		for _, o := range objs {
			if skip(o) {
				continue
			}
			if gctx.Err() != nil {
				break
			}
			g.Go(func() error {
				if err := s.b.Delete(gctx, o.Key); err != nil {
					return err
				}
				deleted.Add(1)
				freed.Add(o.Size)
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		if held.Err() != nil {
			return fmt.Errorf("the store's lock was lost: %w", context.Cause(held))
		}
		return nil
	}
	err = sweep(drop, func(Object) bool { return false })
	st.DeletedManifests = int(deleted.Load())
	for _, o := range drop {
		st.Dropped = append(st.Dropped, strings.TrimPrefix(o.Key, "manifests/"))
	}
	st.BytesFreed = freed.Load()
	if err != nil {
		return st, err
	}
	err = sweep(candidates, func(o Object) bool {
		h, _ := ParseHash(o.Key[strings.LastIndexByte(o.Key, '/')+1:])
		return marked[h]
	})
	st.DeletedChunks = int(deleted.Load())
	st.BytesFreed = freed.Load()
	if err != nil {
		return st, err
	}
	err = sweep(packCandidates, func(o Object) bool {
		id, _ := ParseHash(strings.TrimPrefix(o.Key, "packs/"))
		return markedPacks[id]
	})
	st.DeletedPacks = int(deleted.Load())
	st.BytesFreed = freed.Load()
	return st, err
}

// mark reads the manifests (in parallel, verified), marks the chunks and
// packs they list and adds them to kept, then does the same for their bases not yet
// kept, and theirs. A kept manifest that cannot be read stops the
// collection: its chunks would otherwise be swept. (A manifest is not
// resolved here: the chunks it copies are its base's, marked with it.)
func (s *Store) mark(ctx context.Context, roots []Hash, kept, marked, packs map[Hash]bool, mu *sync.Mutex) error {
	for depth := 0; len(roots) > 0; depth++ {
		if depth > maxBaseDepth {
			return fmt.Errorf("manifests over one another more than %d deep: %w", maxBaseDepth, errdefs.ErrCorrupt)
		}
		var bases []Hash
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(s.parallel)
		for _, r := range roots {
			if kept[r] {
				continue
			}
			kept[r] = true
			g.Go(func() error {
				b, err := s.b.Get(gctx, ManifestKey(r))
				if err != nil {
					if isNotFound(err) {
						// Deleted meanwhile; or a base that is gone,
						// which leaves the manifests over it unreadable
						// but must not stop every collection.
						return nil
					}
					return fmt.Errorf("reading manifest %s: %w", r, err)
				}
				m, err := Decode(b, r)
				if err != nil {
					return err
				}
				hashes := m.ownHashes()
				mu.Lock()
				defer mu.Unlock()
				for _, h := range hashes {
					if _, _, packed := m.Locate(h); !packed {
						marked[h] = true
					}
				}
				for _, p := range m.Packs {
					packs[p.ID] = true
				}
				if m.Base != (Hash{}) {
					bases = append(bases, m.Base)
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		roots = bases
	}
	return nil
}
