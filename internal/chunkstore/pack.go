package chunkstore

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Pack files (manifest version 3). An export with packs on
// (Options.PackBytes) writes the chunks the store lacks not one object
// each but concatenated into a few pack objects of about PackBytes, and
// its manifest lists each pack's chunks in order: a chunk's place is its
// pack and the sizes of the chunks before it there. A cold import then
// reads a pack's chunks with a few ranged GETs instead of one GET per
// 40 KB chunk (17x faster per byte from S3; docs/benchmarks.md), and
// still verifies every chunk by its hash before it is cached or written.
//
// A pack is named by the BLAKE3-256 hash of its chunk list (the binary
// form of version 1: per chunk, uvarint(size<<1), hash), so the same
// chunks in the same order are the same pack, and an export that failed
// half-way and runs again finds the packs it uploaded before. A manifest
// names the packs it wrote; a manifest over a base (version 3 with a
// "base") also reads its base's chunks from the base's packs. A
// collection keeps a pack while a kept manifest names it, and a kept
// manifest's bases are kept, so a pack lives as long as the manifest that
// wrote it or any manifest over that one. Packed chunks are not objects of
// their own: an export's existence check does not find them (only an
// export over the manifest that wrote them does, through its base; see
// Options.PackBytes for what that costs).

// Limits on the packs a manifest may name.
const (
	maxPacks     = 1 << 16
	maxPackBytes = 1 << 30
	// DefaultPackBytes is the pack size Open uses for s3:// stores: a
	// single PUT (minio-go goes multipart from 16 MiB), a few per image.
	DefaultPackBytes = 8 << 20
	// rangeBytes is the most one ranged read of a pack asks for, and
	// rangeGap the most bytes it reads that the import does not need
	// (chunks the cache holds) rather than start another.
	rangeBytes = 4 << 20
	rangeGap   = 64 << 10
)

// Pack is one pack file a manifest wrote: its chunks in the order they
// are concatenated (none zero). ID is the hash of the chunk list.
type Pack struct {
	ID     Hash
	Chunks []Chunk
}

// Bytes is the pack's size.
func (p Pack) Bytes() int64 {
	var n int64
	for _, c := range p.Chunks {
		n += int64(c.Size)
	}
	return n
}

// PackKey is the object key of the pack id.
func PackKey(id Hash) string { return "packs/" + id.String() }

// loc is where a packed chunk is: its pack and offset there.
type loc struct {
	pack Hash
	off  int64
}

// Locate reports where the store holds chunk h of the manifest: in a pack
// (its ID, and the chunk's offset there), or, ok false, as an object of
// its own (ChunkKey). A resolved manifest locates the chunks of its bases'
// packs too.
func (m *Manifest) Locate(h Hash) (pack Hash, off int64, ok bool) {
	l, ok := m.locs[h]
	return l.pack, l.off, ok
}

// newPack returns the pack of chunks, named.
func newPack(chunks []Chunk) Pack {
	return Pack{ID: Sum(appendChunks(nil, chunks)), Chunks: chunks}
}

// makePacks cuts the chunks hashes (sizes from sizes) into packs of about
// target bytes, in order.
func makePacks(hashes []Hash, size func(Hash) int, target int) []Pack {
	packs := []Pack{}
	var cur []Chunk
	var n int
	for _, h := range hashes {
		sz := size(h)
		if len(cur) > 0 && n+sz > target {
			packs = append(packs, newPack(cur))
			cur, n = nil, 0
		}
		cur = append(cur, Chunk{Size: sz, Hash: h})
		n += sz
	}
	if len(cur) > 0 {
		packs = append(packs, newPack(cur))
	}
	return packs
}

type wirePack struct {
	ID     string `json:"id"`
	Chunks string `json:"chunks"`
}

func encodePacks(packs []Pack) []wirePack {
	out := make([]wirePack, len(packs))
	for i, p := range packs {
		out[i] = wirePack{ID: p.ID.String(), Chunks: base64.StdEncoding.EncodeToString(appendChunks(nil, p.Chunks))}
	}
	return out
}

// decodePacks reads a manifest's packs, checks each against its name, and
// returns where each chunk is. A chunk in two packs, or a zero chunk in
// one, is refused: no encoder writes that.
func decodePacks(wps []wirePack) ([]Pack, map[Hash]loc, error) {
	packs := make([]Pack, 0, len(wps))
	locs := make(map[Hash]loc)
	for _, wp := range wps {
		id, err := ParseHash(wp.ID)
		if err != nil || id.String() != wp.ID {
			return nil, nil, fmt.Errorf("pack %q: want a hash in lower-case hex", wp.ID)
		}
		raw, err := base64.StdEncoding.Strict().DecodeString(wp.Chunks)
		if err != nil {
			return nil, nil, fmt.Errorf("pack %s: %v", id, err)
		}
		if Sum(raw) != id {
			return nil, nil, fmt.Errorf("pack %s: its chunk list hashes to %s", id, Sum(raw))
		}
		var cs []Chunk
		var off int64
		for b := raw; len(b) > 0; {
			c, n, err := readChunk(b)
			if err != nil {
				return nil, nil, fmt.Errorf("pack %s: %w", id, err)
			}
			b = b[n:]
			if c.Zero {
				return nil, nil, fmt.Errorf("pack %s: a zero chunk", id)
			}
			if _, dup := locs[c.Hash]; dup {
				return nil, nil, fmt.Errorf("chunk %s in two places of its packs", c.Hash)
			}
			locs[c.Hash] = loc{id, off}
			off += int64(c.Size)
			if off > maxPackBytes {
				return nil, nil, fmt.Errorf("pack %s: more than %d bytes", id, maxPackBytes)
			}
			cs = append(cs, c)
		}
		if len(cs) == 0 {
			return nil, nil, fmt.Errorf("pack %s: no chunks", id)
		}
		packs = append(packs, Pack{ID: id, Chunks: cs})
	}
	return packs, locs, nil
}

// uploadPacks writes the packs, each assembled from the image's chunks
// read again and hashed again (as upload does for loose chunks), a few at
// a time: each is held whole in memory.
func (s *Store) uploadPacks(ctx context.Context, dir string, names []string, packs []Pack, locs map[Hash]where, total int64, st *Stats) error {
	if len(packs) == 0 {
		return nil
	}
	files, closeAll, err := openAll(dir, names)
	if err != nil {
		return err
	}
	defer closeAll()
	var done, count atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(min(s.parallel, 4))
	for _, p := range packs {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			buf := make([]byte, p.Bytes())
			pos := 0
			for _, c := range p.Chunks {
				l := locs[c.Hash]
				dst := buf[pos : pos+c.Size]
				pos += c.Size
				if _, err := files[l.file].ReadAt(dst, l.off); err != nil {
					return fmt.Errorf("reading %s: %w", names[l.file], err)
				}
				if Sum(dst) != c.Hash {
					return fmt.Errorf("%s changed while it was exported", names[l.file])
				}
			}
			if err := s.b.Put(gctx, PackKey(p.ID), buf); err != nil {
				return fmt.Errorf("uploading pack %s: %w", p.ID, err)
			}
			count.Add(int64(len(p.Chunks)))
			s.report("export", "upload", done.Add(int64(len(buf))), total)
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

// packsOver returns the packs of an export of m over the base manifest
// bm (nil for none): the stored chunks bm lacks, in m's order, cut into
// packs of about s.pack bytes.
func (s *Store) packsOver(m, bm *Manifest, locs map[Hash]where) []Pack {
	inBase := map[Hash]bool{}
	if bm != nil {
		for _, h := range bm.Hashes() {
			inBase[h] = true
		}
	}
	var fresh []Hash
	for _, h := range m.Hashes() {
		if !inBase[h] {
			fresh = append(fresh, h)
		}
	}
	return makePacks(fresh, func(h Hash) int { return locs[h].size }, s.pack)
}

// exportPacked is the rest of an export with packs on, from the existence
// check (the caller holds the store's lock shared, and the base, if any,
// is still there): the packs of m the store lacks are uploaded (an export
// that ran before and failed may have uploaded some), then the manifest
// that names them.
func (s *Store) exportPacked(held context.Context, dir string, names []string, m *Manifest, hashes []Hash,
	locs map[Hash]where, root Hash, body []byte, st *Stats, phase func(string, time.Time), tk time.Time) error {
	st.Packs = len(m.Packs)
	keys := make([]string, len(m.Packs))
	for i, p := range m.Packs {
		keys[i] = PackKey(p.ID)
	}
	found, err := s.b.Has(held, keys)
	if err != nil {
		return fmt.Errorf("checking which packs are stored: %w", err)
	}
	var missing []Pack
	var total int64
	st.Present = len(hashes)
	for i, p := range m.Packs {
		if !found[i] {
			missing = append(missing, p)
			total += p.Bytes()
			st.Present -= len(p.Chunks)
		}
	}
	phase("export.check", tk)

	tu := time.Now()
	if err := s.uploadPacks(held, dir, names, missing, locs, total, st); err != nil {
		return err
	}
	if len(missing) > 0 {
		if err := s.b.Flush(held); err != nil {
			return err
		}
	}
	phase("export.upload", tu)
	return s.putManifest(held, root, body, func(start time.Time) { phase("export.manifest", start) })
}

// span is one ranged read of a pack: the chunks from off, n bytes.
type span struct {
	pack   Hash
	off    int64
	n      int
	chunks []spanChunk
}

type spanChunk struct {
	hash Hash
	off  int64 // in the pack
	size int
}

// spans groups the packed chunks hashes (of manifest m) into ranged reads
// of up to rangeBytes, each over consecutive chunks of one pack with at
// most rangeGap bytes between them.
func spans(m *Manifest, hashes []Hash, size func(Hash) int) []span {
	type placed struct {
		l    loc
		h    Hash
		size int
	}
	cs := make([]placed, 0, len(hashes))
	for _, h := range hashes {
		cs = append(cs, placed{m.locs[h], h, size(h)})
	}
	slices.SortFunc(cs, func(a, b placed) int {
		if c := slices.Compare(a.l.pack[:], b.l.pack[:]); c != 0 {
			return c
		}
		return cmp.Compare(a.l.off, b.l.off)
	})
	var out []span
	for _, c := range cs {
		if len(out) > 0 {
			last := &out[len(out)-1]
			end := last.off + int64(last.n)
			if last.pack == c.l.pack && c.l.off >= end && c.l.off-end <= rangeGap && c.l.off+int64(c.size)-last.off <= rangeBytes {
				last.n = int(c.l.off + int64(c.size) - last.off)
				last.chunks = append(last.chunks, spanChunk{c.h, c.l.off, c.size})
				continue
			}
		}
		out = append(out, span{pack: c.l.pack, off: c.l.off, n: c.size, chunks: []spanChunk{{c.h, c.l.off, c.size}}})
	}
	return out
}

// readSpan reads one span of a pack and calls fn with each of its chunks,
// verified: a chunk that does not hash to its name, or a pack shorter
// than the manifest says, is ErrCorrupt.
// A pack the backend does not have (a peer's handler serves chunks, not
// packs) is read as its chunks' own objects, if it has those.
func (s *Store) readSpan(ctx context.Context, sp span, fn func(h Hash, data []byte)) error {
	data, err := getRange(ctx, s.b, PackKey(sp.pack), sp.off, int64(sp.n))
	if isNotFound(err) {
		for _, c := range sp.chunks {
			b, cerr := s.fetch(ctx, s.b, c.hash, c.size)
			if cerr != nil {
				if isNotFound(cerr) {
					return fmt.Errorf("reading pack %s: %w", sp.pack, err)
				}
				return cerr
			}
			fn(c.hash, b)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading pack %s: %w", sp.pack, err)
	}
	if len(data) != sp.n {
		return fmt.Errorf("pack %s: %d bytes at %d, the manifest says %d: %w", sp.pack, len(data), sp.off, sp.n, errdefs.ErrCorrupt)
	}
	for _, c := range sp.chunks {
		b := data[c.off-sp.off : c.off-sp.off+int64(c.size)]
		if err := verify("chunk", c.hash, b); err != nil {
			return fmt.Errorf("in pack %s at %d: %w", sp.pack, c.off, err)
		}
		fn(c.hash, b)
	}
	return nil
}
