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

// Import rebuilds the image the manifest root names into dir, which must
// not exist (its parent must): byte for byte, zero chunks left as holes.
// Chunks come from the cache when it holds them, else from the store
// (s.parallel at a time), every one verified first; those fetched are
// put in the cache behind the import (written after it returns; see
// Cache). The image is assembled beside dir and renamed into place, so
// dir appears whole or not at all (it is not synced: after a crash,
// import again). Phases: import.manifest, import.fetch (the chunks the
// cache lacks), import.assemble (read, verify, write), import.finish.
func (s *Store) Import(ctx context.Context, root Hash, dir string) (st Stats, err error) {
	return s.importFrom(ctx, s.b, root, dir)
}

// importFrom is Import reading manifests and chunks the cache lacks from
// src: the store's backend, or a peer before it (ImportFrom).
func (s *Store) importFrom(ctx context.Context, src Backend, root Hash, dir string) (st Stats, err error) {
	t0 := time.Now()
	st.Root = root
	defer func() {
		st.Duration = time.Since(t0)
		if err != nil {
			err = fmt.Errorf("importing %s from %s into %s: %w", root, src, dir, err)
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
	m, err := s.manifest(ctx, src, root, 0)
	if err != nil {
		return st, err
	}
	m = s.keepBase(root, m) // an image others are written over, pulled: read only from here on
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
	// The image as runs of consecutive stored chunks (up to runBytes), each
	// assembled in one buffer and written with one call.
	var runs []run
	var runTotal int64             // the bytes runs write
	distinct := make(map[Hash]int) // size
	var order []Hash
	fileKeys := make([]string, len(m.Files))
	for i, mf := range m.Files {
		if mf.Size >= linkMin && s.linkRemembered(mf, filepath.Join(tmp, mf.Name)) {
			st.LinkedFiles++
			st.Chunks += len(mf.Chunks)
			continue
		}
		if s.link && mf.Size >= linkMin {
			fileKeys[i] = fileKey(mf)
			if s.cache.link(fileKeys[i], filepath.Join(tmp, mf.Name)) {
				st.LinkedFiles++
				st.Chunks += len(mf.Chunks)
				fileKeys[i] = "" // nothing to adopt
				continue
			}
		}
		f, err := os.OpenFile(filepath.Join(tmp, mf.Name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return st, err
		}
		files[i] = f
		if err := f.Truncate(mf.Size); err != nil {
			return st, err
		}
		var off int64
		var cur *run
		for _, c := range mf.Chunks {
			st.Chunks++
			if c.Zero {
				st.ZeroChunks++
				cur = nil
				off += int64(c.Size)
				continue
			}
			if _, ok := distinct[c.Hash]; !ok {
				distinct[c.Hash] = c.Size
				order = append(order, c.Hash)
			}
			if cur == nil || cur.bytes+c.Size > runBytes {
				runs = append(runs, run{file: i, off: off})
				cur = &runs[len(runs)-1]
			}
			cur.chunks = append(cur.chunks, c)
			cur.bytes += c.Size
			runTotal += int64(c.Size)
			off += int64(c.Size)
		}
	}
	st.Files, st.Bytes, st.Distinct = len(m.Files), m.Bytes(), len(order)
	if pf, ok := src.(*peerFirst); ok {
		// What the peer does not give comes from where the store holds it.
		pf.storeChunk = func(ctx context.Context, h Hash) ([]byte, error) { return s.fetchAt(ctx, m, h, distinct[h]) }
	}

	// Fetch what the cache lacks (each distinct chunk once), verified, and
	// put it in the cache behind the import (the cache's writers write it
	// after; the import never waits for them); the assembly reads the
	// chunks fetched from memory when they are at most memBytes, else
	// from the cache. Without a cache, runs read the store directly.
	var fetched, corrupt atomic.Int64
	var fetchedBytes atomic.Int64
	var mem fetchedMem
	if s.cache != nil {
		var missing, packed []Hash
		var total int64
		for _, h := range order {
			if !s.cache.has(ChunkKey(h)) {
				if _, _, ok := m.Locate(h); ok && src == s.b {
					packed = append(packed, h)
				} else {
					missing = append(missing, h)
				}
				total += int64(distinct[h])
			}
		}
		st.Present = len(order) - len(missing) - len(packed)
		mem.keep = total <= memBytes
		var done atomic.Int64
		got := func(h Hash, data []byte) {
			mem.add(h, data)
			s.cache.putBehind(ChunkKey(h), data)
			fetched.Add(1)
			fetchedBytes.Add(int64(len(data)))
			s.report("import", "fetch", done.Add(int64(len(data))), total)
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(s.parallel)
		// Packed chunks by ranged reads of their packs, each chunk
		// verified.
		sps := spans(m, packed, func(h Hash) int { return distinct[h] })
		st.Packs = len(sps)
		for _, sp := range sps {
			if gctx.Err() != nil {
				break
			}
			g.Go(func() error { return s.readSpan(gctx, sp, got) })
		}
		for _, h := range missing {
			if gctx.Err() != nil {
				break
			}
			g.Go(func() error {
				data, err := s.fetch(gctx, src, h, distinct[h])
				if err != nil {
					return err
				}
				got(h, data)
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			st.Transferred, st.TransferredBytes = int(fetched.Load()), fetchedBytes.Load()
			return st, err
		}
		if err := ctx.Err(); err != nil {
			return st, err
		}
		phase("import.fetch", tc)
	}
	ta := time.Now()
	var written atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.parallel)
	for _, r := range runs {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			buf := takeRunBuf(r.bytes)
			defer giveRunBuf(buf)
			pos := 0
			for _, c := range r.chunks {
				dst := buf[pos : pos+c.Size]
				pos += c.Size
				if d, ok := mem.get(c.Hash); ok {
					copy(dst, d) // verified when it was fetched
					continue
				}
				if s.cache != nil {
					hit, bad := s.cache.readInto(ChunkKey(c.Hash), dst)
					if hit && Sum(dst) == c.Hash {
						continue
					}
					if hit {
						s.cache.remove(ChunkKey(c.Hash))
					}
					if hit || bad {
						corrupt.Add(1)
					}
				}
				if s.cache == nil {
					if err := s.fetchInto(gctx, src, m, c.Hash, dst); err != nil {
						return err
					}
				} else {
					data, err := s.fetchVia(gctx, src, m, c.Hash, c.Size)
					if err != nil {
						return err
					}
					copy(dst, data)
					s.cache.putBehind(ChunkKey(c.Hash), data)
				}
				fetched.Add(1)
				fetchedBytes.Add(int64(c.Size))
			}
			if _, err := files[r.file].WriteAt(buf, r.off); err != nil {
				return fmt.Errorf("writing %s: %w", m.Files[r.file].Name, err)
			}
			s.report("import", "assemble", written.Add(int64(len(buf))), runTotal)
			return nil
		})
	}
	err = g.Wait()
	st.Transferred, st.TransferredBytes, st.CacheCorrupt = int(fetched.Load()), fetchedBytes.Load(), int(corrupt.Load())
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return st, err
	}
	phase("import.assemble", ta)

	tf := time.Now()
	for i, f := range files {
		if f == nil {
			continue // linked
		}
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
	for i, k := range fileKeys {
		if k != "" {
			s.cache.adopt(k, filepath.Join(dir, m.Files[i].Name), m.Files[i].Size)
		}
	}
	phase("import.finish", tf)
	return st, nil
}

// memBytes is the most an import keeps in memory of the chunks it
// fetched, for its assembly.
var memBytes int64 = 256 << 20

// fetchedMem is the chunks an import fetched, verified, if it keeps them
// (keep). Safe for concurrent use.
type fetchedMem struct {
	keep bool
	mu   sync.Mutex
	m    map[Hash][]byte
}

func (p *fetchedMem) add(h Hash, data []byte) {
	if !p.keep {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[Hash][]byte)
	}
	p.m[h] = data
}

func (p *fetchedMem) get(h Hash) ([]byte, bool) {
	if !p.keep {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.m[h]
	return d, ok
}

// linkMin is the smallest file Options.LinkFiles keeps whole.
const linkMin = 1 << 20

// fileKey names a whole file in the cache by its size, mode and chunks.
func fileKey(f File) string {
	return "files/" + Sum([]byte(fmt.Sprintf("%d %o %s", f.Size, f.Mode, encodeChunks(f.Chunks)))).String()
}

// runBytes is the most an import assembles before one write.
const runBytes = 1 << 20

// runBufs keeps up to 8 run buffers across imports: a fresh one costs a
// page fault per 4 KiB, and a sync.Pool drops its buffers at every
// collection, so that a daemon's imports, seconds apart, each paid them
// (an import of a suspended sandbox's 3.5 MB: 4.8-5.7 ms back to back,
// 6.0-8.7 after a collection).
var runBufs = make(chan []byte, 8)

// takeRunBuf returns a buffer of n bytes (a kept one if it is large
// enough: n is more than runBytes for one chunk larger than a run).
func takeRunBuf(n int) []byte {
	select {
	case b := <-runBufs:
		if cap(b) >= n {
			return b[:n]
		}
	default:
	}
	return make([]byte, n, max(n, runBytes))
}

// giveRunBuf keeps b for later imports, if there is room.
func giveRunBuf(b []byte) {
	if cap(b) != runBytes {
		return
	}
	select {
	case runBufs <- b:
	default:
	}
}

// run is consecutive stored chunks of one file, from off.
type run struct {
	file   int
	off    int64
	bytes  int
	chunks []Chunk
}

// fetchVia reads chunk h of manifest m from src: a peer first (by its
// hash; ImportFrom), else where the store holds it (fetchAt).
func (s *Store) fetchVia(ctx context.Context, src Backend, m *Manifest, h Hash, size int) ([]byte, error) {
	if src != s.b {
		return s.fetch(ctx, src, h, size)
	}
	return s.fetchAt(ctx, m, h, size)
}

// fetchInto is fetchVia into dst (the chunk's size): a chunk the store
// holds loose is read into it, with no buffer of its own.
func (s *Store) fetchInto(ctx context.Context, src Backend, m *Manifest, h Hash, dst []byte) error {
	if _, _, packed := m.Locate(h); src != s.b || packed {
		data, err := s.fetchVia(ctx, src, m, h, len(dst))
		if err != nil {
			return err
		}
		copy(dst, data)
		return nil
	}
	if err := getInto(ctx, src, ChunkKey(h), dst); err != nil {
		return fmt.Errorf("reading chunk %s: %w", h, err)
	}
	return verify("chunk", h, dst)
}

// fetchAt reads chunk h of manifest m from where the store holds it (its
// pack, or an object of its own) and verifies it.
func (s *Store) fetchAt(ctx context.Context, m *Manifest, h Hash, size int) ([]byte, error) {
	pack, off, ok := m.Locate(h)
	if !ok {
		return s.fetch(ctx, s.b, h, size)
	}
	var data []byte
	err := s.readSpan(ctx, span{pack: pack, off: off, n: size, chunks: []spanChunk{{h, off, size}}}, func(_ Hash, b []byte) { data = b })
	return data, err
}

// fetch reads chunk h from src and verifies it: a chunk that does not
// hash to its name, or is not size bytes, is ErrCorrupt.
func (s *Store) fetch(ctx context.Context, src Backend, h Hash, size int) ([]byte, error) {
	data, err := src.Get(ctx, ChunkKey(h))
	if err != nil {
		return nil, fmt.Errorf("reading chunk %s: %w", h, err)
	}
	if err := verify("chunk", h, data); err != nil {
		return nil, err
	}
	if len(data) != size {
		return nil, fmt.Errorf("chunk %s: %d bytes, the manifest says %d: %w", h, len(data), size, errdefs.ErrCorrupt)
	}
	return data, nil
}
