package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/timing"
)

// where is the first place a distinct chunk was found, to read it again.
type where struct {
	file int
	off  int64
	size int
}

// Export stores the image directory dir (regular files only, no
// subdirectories) and returns its Stats, whose Root names the manifest.
// It uploads the chunks the store lacks, then the manifest; on any error
// (the store down after retries, ctx cancelled) no manifest is written.
// Exporting the same bytes with the same meta again uploads nothing and
// gives the same root. With Options.Immutable, an image that holds a file
// of an image noted as a base (NoteBase, ExportBase) by identity is
// written over that image's manifest (the base exported first if the store
// lacks it). Phases: export.chunk (read, cut, hash, fill the
// cache), export.check, export.upload, export.manifest.
func (s *Store) Export(ctx context.Context, dir string, meta map[string]string) (st Stats, err error) {
	return s.ExportOver(ctx, dir, meta, Hash{})
}

// ExportOver is Export writing the manifest over the manifest base names
// (zero for none; base.go): the image's files as runs of the base's chunks
// and the chunks it lacks, so a manifest of an image restored from the
// base is a few KB. The existence check asks only about the chunks the
// base lacks (a stored manifest's chunks are stored). When the store does
// not hold base (collected), or base already has maxBaseDepth-1 bases
// under it, the manifest is written flat; Stats.Base says which.
func (s *Store) ExportOver(ctx context.Context, dir string, meta map[string]string, base Hash) (st Stats, err error) {
	t0 := time.Now()
	defer func() {
		st.Duration = time.Since(t0)
		if err != nil {
			err = fmt.Errorf("exporting %s to %s: %w", dir, s.b, err)
		}
	}()
	phase := func(name string, start time.Time) {
		d := time.Since(start)
		st.Phases = append(st.Phases, Phase{name, d})
		timing.Add(ctx, name, d)
	}

	p, err := s.plan(ctx, dir, meta, base, &st, phase, false)
	if err != nil {
		return st, err
	}
	names, m, locs, base := p.names, p.m, p.locs, p.base
	body, root := p.body, p.root

	// From the existence check to the manifest, GC must not sweep: a chunk
	// found present now must still be there when the manifest names it.
	held, unlock, err := s.locker.Lock(ctx, LockStore, false)
	if err != nil {
		return st, err
	}
	defer unlock()
	tk := time.Now()
	// The base must still be there (a collection may have taken it before
	// the lock was ours); then its chunks are, until the lock is released.
	inBase := map[Hash]bool{}
	if p.bm != nil {
		found, err := s.b.Has(held, []string{ManifestKey(base)})
		if err != nil {
			return st, fmt.Errorf("checking base %s: %w", base, err)
		}
		if found[0] {
			for _, h := range p.bm.Hashes() {
				inBase[h] = true
			}
		} else {
			p.bm = nil
			if body, root, err = p.encode(); err != nil {
				return st, err
			}
		}
	}
	if p.bm != nil {
		st.Base = base
	}
	st.Root, st.ManifestBytes = root, len(body)
	hashes := m.Hashes()
	if s.pack > 0 {
		err := s.exportPacked(held, dir, names, m, hashes, locs, root, body, &st, phase, tk)
		return st, err
	}
	known, err := s.knownSince(held, hashes)
	if err != nil {
		return st, err
	}
	for i, h := range hashes {
		known[i] = known[i] || inBase[h]
	}
	s.knownMu.Lock()
	epoch := s.knownEpoch
	s.knownMu.Unlock()
	var ask []Hash
	var keys []string
	for i, h := range hashes {
		if !known[i] {
			ask = append(ask, h)
			keys = append(keys, ChunkKey(h))
		}
	}
	st.Asked = len(ask)
	found, err := s.b.Has(held, keys)
	if err != nil {
		return st, fmt.Errorf("checking which chunks are stored: %w", err)
	}
	var missing, present []Hash
	var total int64
	for i, h := range ask {
		if found[i] {
			present = append(present, h)
		} else {
			missing = append(missing, h)
			total += int64(locs[h].size)
		}
	}
	st.Present = len(hashes) - len(missing)
	s.remember(epoch, present)
	phase("export.check", tk)

	tu := time.Now()
	if err := s.upload(held, dir, names, missing, locs, total, &st); err != nil {
		return st, err
	}
	if len(missing) > 0 {
		if err := s.b.Flush(held); err != nil {
			return st, err
		}
	}
	s.remember(epoch, missing)
	phase("export.upload", tu)

	return st, s.putManifest(held, root, body, func(start time.Time) { phase("export.manifest", start) })
}

// putManifest writes the manifest, last, if the store's lock is still
// held; phase records its time.
func (s *Store) putManifest(held context.Context, root Hash, body []byte, phase func(time.Time)) error {
	tm := time.Now()
	if err := held.Err(); err != nil {
		return fmt.Errorf("the store's lock was lost: %w", context.Cause(held))
	}
	if err := s.b.Put(held, ManifestKey(root), body); err != nil {
		return fmt.Errorf("writing manifest %s: %w", root, err)
	}
	if s.cache != nil {
		s.cache.put(ManifestKey(root), body)
	}
	phase(tm)
	return nil
}

// plan is an export up to its manifest: the image's files cut (or
// recalled), the base chosen, the manifest encoded. Export uploads what
// the store lacks of it; Offer serves it to peers.
type plan struct {
	s     *Store
	names []string
	m     *Manifest
	locs  map[Hash]where // where each distinct stored chunk is first
	bm    *Manifest      // the base's, resolved; nil for none
	base  Hash
	// baseBody is the base's manifest when an offer planned it (the store
	// lacks it); nil when it was read from the store.
	baseBody []byte
	body     []byte
	root     Hash
}

// encode encodes the manifest over the base, if any, with its packs (with
// packs on: the chunks the base lacks): its root depends on the image,
// meta and base only.
func (p *plan) encode() ([]byte, Hash, error) {
	if p.s.pack > 0 {
		p.m.Packs = p.s.packsOver(p.m, p.bm, p.locs)
	}
	if p.bm == nil {
		return p.m.Encode()
	}
	return p.m.EncodeOver(p.bm, p.base)
}

// plan cuts the image dir and encodes its manifest over base (zero: the
// noted base it holds a file of, if any, exported first if the store
// lacks it), recording export.chunk. For an offer, every file cut is
// remembered (with Options.Immutable), not only those with other names:
// the image is exported later and is not cut again; and a noted base the
// store lacks is planned, not exported: its manifest is the one the
// export will store first (plan.baseBody).
func (s *Store) plan(ctx context.Context, dir string, meta map[string]string, base Hash, st *Stats, phase func(string, time.Time), offer bool) (*plan, error) {
	names, err := imageFiles(dir)
	if err != nil {
		return nil, err
	}
	tc := time.Now()
	m := &Manifest{Chunking: s.chunking, Meta: meta}
	locs := make(map[Hash]where)
	pr := chunkProgress{}
	for _, name := range names {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		pr.total += info.Size()
	}
	for i, name := range names {
		path := filepath.Join(dir, name)
		if f, ok := s.recall(path); ok {
			f.Name = name
			s.reuseFile(f, i, locs, &pr, st)
			m.Files = append(m.Files, f)
			continue
		}
		before, _ := identify(path)
		f, err := s.chunkFile(ctx, path, name, i, locs, &pr, st)
		if err != nil {
			return nil, err
		}
		s.keep(path, before, f, !offer)
		m.Files = append(m.Files, f)
	}
	phase("export.chunk", tc)
	var localBase *plan
	if base == (Hash{}) {
		// A noted base this image holds a file of: exported first if it
		// never was, or was collected (an offer plans it instead).
		if b, ok := s.baseFor(dir, names); ok {
			found := b.root != (Hash{})
			if found {
				if found, err = s.HasManifest(ctx, b.root); err != nil {
					return nil, fmt.Errorf("checking base %s: %w", b.root, err)
				}
			}
			if !found && offer {
				// What an export would store first, planned here and not
				// uploaded (the offer serves its manifest).
				var bst Stats
				if bp, err := s.plan(ctx, b.dir, b.meta, Hash{}, &bst, func(string, time.Time) {}, false); err == nil {
					localBase = bp
					b.root = bp.root
				} else {
					b.root = Hash{} // the base image is gone or changed: flat
				}
			} else if !found {
				bst, err := s.exportBase(ctx, b)
				switch {
				case err == nil:
					b.root = bst.Root
				case ctx.Err() != nil, errors.Is(err, errdefs.ErrUnavailable):
					return nil, fmt.Errorf("exporting its base %s: %w", b.dir, err)
				default:
					b.root = Hash{} // the base image is gone or changed: flat
				}
			}
			base = b.root
		}
	}
	p := &plan{s: s, names: names, m: m, locs: locs, base: base}
	if localBase != nil {
		p.bm, p.baseBody = localBase.m, localBase.body
	} else if base != (Hash{}) {
		p.bm, err = s.Manifest(ctx, base)
		switch {
		case isNotFound(err):
			p.bm = nil
		case err != nil:
			return nil, fmt.Errorf("reading base %s: %w", base, err)
		case p.bm.depth+1 >= maxBaseDepth:
			p.bm = nil
		}
	}
	if p.body, p.root, err = p.encode(); err != nil {
		return nil, err
	}
	st.Files, st.Bytes, st.Distinct = len(m.Files), m.Bytes(), len(locs)
	return p, nil
}

// imageFiles lists the regular files of an image directory, sorted.
func imageFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("image directory %s: %w", dir, errdefs.ErrNotFound)
		}
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "image directory %s: %s is not a regular file", dir, e.Name())
		}
		if err := ValidName(e.Name()); err != nil {
			return nil, err
		}
		names = append(names, e.Name())
	}
	if len(names) > maxFiles {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "image directory %s: %d files, more than %d", dir, len(names), maxFiles)
	}
	slices.Sort(names)
	return names, nil
}

// chunkProgress is how far export.chunk is over the whole image.
type chunkProgress struct {
	done  atomic.Int64
	total int64 // the files' sizes when the export began
}

// chunkFile cuts one file into chunks and hashes them (on every CPU),
// records where each new distinct chunk is, and fills the cache.
func (s *Store) chunkFile(ctx context.Context, path, name string, fileIdx int, locs map[Hash]where, pr *chunkProgress, st *Stats) (File, error) {
	f, err := os.Open(path)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return File{}, err
	}
	out := File{Name: name, Size: info.Size(), Mode: info.Mode().Perm()}

	type job struct {
		idx  int
		data []byte
	}
	jobs := make(chan job, 2*runtime.GOMAXPROCS(0))
	var mu sync.Mutex
	hashes := make(map[int]Hash)
	g, gctx := errgroup.WithContext(ctx)
	for range runtime.GOMAXPROCS(0) {
		g.Go(func() error {
			for j := range jobs {
				h := Sum(j.data)
				if s.cache != nil {
					s.cache.put(ChunkKey(h), j.data)
				}
				mu.Lock()
				hashes[j.idx] = h
				mu.Unlock()
			}
			return nil
		})
	}
	offsets := []int64{}
	splitErr := s.chunking.Split(f, func(off int64, data []byte) error {
		c := Chunk{Size: len(data)}
		if allZero(data) {
			c.Zero = true
			st.ZeroChunks++
		} else {
			select {
			case jobs <- job{len(out.Chunks), slices.Clone(data)}:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		out.Chunks = append(out.Chunks, c)
		offsets = append(offsets, off)
		s.report("export", "chunk", min(pr.done.Add(int64(len(data))), pr.total), pr.total)
		return nil
	})
	close(jobs)
	if err := g.Wait(); err != nil {
		return File{}, err
	}
	if splitErr != nil {
		return File{}, fmt.Errorf("reading %s: %w", path, splitErr)
	}
	var total int64
	for i := range out.Chunks {
		c := &out.Chunks[i]
		total += int64(c.Size)
		if c.Zero {
			continue
		}
		c.Hash = hashes[i]
		if _, ok := locs[c.Hash]; !ok {
			locs[c.Hash] = where{fileIdx, offsets[i], c.Size}
		}
	}
	// The file changed while it was read: its chunks are not its size.
	if total != out.Size {
		return File{}, fmt.Errorf("%s changed while it was read (%d bytes, then %d)", path, out.Size, total)
	}
	st.Chunks += len(out.Chunks)
	return out, nil
}

// upload puts the missing chunks, read again from the image and hashed
// again (an image that changed under the export must not store wrong
// bytes under a hash), s.parallel at a time.
func (s *Store) upload(ctx context.Context, dir string, names []string, missing []Hash, locs map[Hash]where, total int64, st *Stats) error {
	if len(missing) == 0 {
		return nil
	}
	files, closeAll, err := openAll(dir, names)
	if err != nil {
		return err
	}
	defer closeAll()
	var done atomic.Int64
	var count atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.parallel)
	for _, h := range missing {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			l := locs[h]
			buf := make([]byte, l.size)
			if _, err := files[l.file].ReadAt(buf, l.off); err != nil {
				return fmt.Errorf("reading %s: %w", names[l.file], err)
			}
			if Sum(buf) != h {
				return fmt.Errorf("%s changed while it was exported", names[l.file])
			}
			if err := s.b.Put(gctx, ChunkKey(h), buf); err != nil {
				return fmt.Errorf("uploading chunk %s: %w", h, err)
			}
			count.Add(1)
			s.report("export", "upload", done.Add(int64(l.size)), total)
			return nil
		})
	}
	err = g.Wait()
	st.Transferred, st.TransferredBytes = int(count.Load()), done.Load()
	if err == nil {
		err = ctx.Err()
	}
	return err
}

// openAll opens the image's files named, in order; closeAll closes them.
func openAll(dir string, names []string) (files []*os.File, closeAll func(), err error) {
	files = make([]*os.File, len(names))
	closeAll = func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}
	for i, n := range names {
		if files[i], err = os.Open(filepath.Join(dir, n)); err != nil {
			closeAll()
			return nil, nil, err
		}
	}
	return files, closeAll, nil
}
