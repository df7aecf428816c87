package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/timing"
)

// at is one place a chunk goes in an image.
type at struct {
	file int
	off  int64
}

// Import rebuilds the image the manifest root names into dir, which must
// not exist (its parent must): byte for byte, zero chunks left as holes.
// Chunks come from the cache when it holds them, else from the store
// (s.parallel at a time, then kept in the cache); every one is verified
// first. The image is assembled beside dir and renamed into place, so dir
// appears whole or not at all (it is not synced: after a crash, import
// again). Phases: import.manifest, import.chunks (fetch, verify, write),
// import.finish.
func (s *Store) Import(ctx context.Context, root Hash, dir string) (st Stats, err error) {
	t0 := time.Now()
	st.Root = root
	defer func() {
		st.Duration = time.Since(t0)
		if err != nil {
			err = fmt.Errorf("importing %s from %s into %s: %w", root, s.b, dir, err)
		}
	}()
	phase := func(name string, start time.Time) {
		d := time.Since(start)
		st.Phases = append(st.Phases, Phase{name, d})
		timing.Add(ctx, name, d)
	}
	if _, err := os.Lstat(dir); err == nil {
		return st, errdefs.New(errdefs.ErrAlreadyExists, "image directory %s already exists", dir)
	}
	tm := time.Now()
	m, err := s.Manifest(ctx, root)
	if err != nil {
		return st, err
	}
	phase("import.manifest", tm)

	tc := time.Now()
	tmp := dir + ".import-" + randomHex(4)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return st, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	files := make([]*os.File, len(m.Files))
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	// Where each distinct chunk goes, in first-use order (so the writes
	// of each worker run mostly forward through the files).
	places := make(map[Hash][]at)
	var order []Hash
	sizes := make(map[Hash]int)
	var total int64
	for i, mf := range m.Files {
		f, err := os.OpenFile(filepath.Join(tmp, mf.Name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return st, err
		}
		files[i] = f
		if err := f.Truncate(mf.Size); err != nil {
			return st, err
		}
		var off int64
		for _, c := range mf.Chunks {
			st.Chunks++
			if c.Zero {
				st.ZeroChunks++
			} else {
				if _, ok := places[c.Hash]; !ok {
					order = append(order, c.Hash)
					sizes[c.Hash] = c.Size
					total += int64(c.Size)
				}
				places[c.Hash] = append(places[c.Hash], at{i, off})
			}
			off += int64(c.Size)
		}
	}
	st.Files, st.Bytes, st.Distinct = len(m.Files), m.Bytes(), len(order)

	var hits, fetched, corrupt atomic.Int64
	var fetchedBytes, done atomic.Int64
	bufs := sync.Pool{New: func() any { b := make([]byte, 0, 256<<10); return &b }}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.parallel)
	for _, h := range order {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			bp := bufs.Get().(*[]byte)
			defer bufs.Put(bp)
			data, src, err := s.chunk(gctx, h, sizes[h], *bp)
			if err != nil {
				return err
			}
			if cap(data) > cap(*bp) {
				*bp = data[:0]
			}
			switch src {
			case fromCache:
				hits.Add(1)
			case fromCacheCorrupt:
				corrupt.Add(1)
				fallthrough
			case fromStore:
				fetched.Add(1)
				fetchedBytes.Add(int64(len(data)))
			}
			for _, p := range places[h] {
				if _, err := files[p.file].WriteAt(data, p.off); err != nil {
					return fmt.Errorf("writing %s: %w", m.Files[p.file].Name, err)
				}
			}
			s.report("import", "fetch", done.Add(int64(len(data))), total)
			return nil
		})
	}
	err = g.Wait()
	st.Present, st.Transferred, st.TransferredBytes, st.CacheCorrupt =
		int(hits.Load()), int(fetched.Load()), fetchedBytes.Load(), int(corrupt.Load())
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return st, err
	}
	phase("import.chunks", tc)

	tf := time.Now()
	for i, f := range files {
		if err := f.Chmod(m.Files[i].Mode); err != nil {
			return st, err
		}
		if err := f.Close(); err != nil {
			files[i] = nil
			return st, err
		}
		files[i] = nil
	}
	if err := os.Rename(tmp, dir); err != nil {
		if errors.Is(err, os.ErrExist) {
			return st, errdefs.New(errdefs.ErrAlreadyExists, "image directory %s already exists", dir)
		}
		return st, err
	}
	phase("import.finish", tf)
	return st, nil
}

type source int

const (
	fromCache source = iota
	fromStore
	fromCacheCorrupt // the cache's copy was bad; this one is the store's
)

// chunk returns the verified bytes of chunk h (in buf if it fits), from
// the cache, else from the store (then cached). A chunk that fails
// verification in the store is ErrCorrupt; one that fails in the cache is
// dropped from it and read from the store.
func (s *Store) chunk(ctx context.Context, h Hash, size int, buf []byte) ([]byte, source, error) {
	key := ChunkKey(h)
	src := fromStore
	if s.cache != nil {
		if data, ok := s.cache.read(key, buf); ok {
			if len(data) == size && Sum(data) == h {
				return data, fromCache, nil
			}
			s.cache.remove(key)
			src = fromCacheCorrupt
		}
	}
	data, err := s.b.Get(ctx, key)
	if err != nil {
		return nil, src, fmt.Errorf("reading chunk %s: %w", h, err)
	}
	if err := verify("chunk", h, data); err != nil {
		return nil, src, err
	}
	if len(data) != size {
		return nil, src, fmt.Errorf("chunk %s: %d bytes, the manifest says %d: %w", h, len(data), size, errdefs.ErrCorrupt)
	}
	if s.cache != nil {
		s.cache.put(key, data)
	}
	return data, src, nil
}
