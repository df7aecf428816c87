package chunkstore

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
)

// A manifest over a base (version 2) names the root of another manifest,
// its base, and gives each file's chunk list as a sequence of operations
// on the base's resolved files instead of listing every chunk: a
// suspended sandbox restored from a template's warm image shares most of
// its chunks, in runs, with that image, so its manifest lists what it
// changed and a few references (a few KB where a flat one is 80 KB).
//
// A file's "chunks" string is then the standard base64 of, per operation:
//
//	uvarint(n<<1 | 1), uvarint(file), uvarint(start)   n chunks of the base's
//	                                                    file number file (in
//	                                                    its sorted list),
//	                                                    from chunk start
//	uvarint(n<<1), then n chunks as in version 1        n chunks listed here
//
// with n >= 1, every varint in its shortest form, and no two listing
// operations in a row. A base may itself have a base, up to maxBaseDepth
// manifests in all; reading one reads (and verifies) its bases, and a
// collection keeps a manifest's bases as long as it keeps the manifest.

// op is one operation of a file over a base: count chunks copied from
// the base's file from start, or chunks listed.
type op struct {
	copy               bool
	file, start, count int
	chunks             []Chunk
}

// baseIndex maps each stored chunk of a base to where it first appears.
type baseIndex map[Hash]struct{ file, idx int }

func indexBase(base *Manifest) baseIndex {
	idx := make(baseIndex)
	for fi, f := range base.Files {
		for ci, c := range f.Chunks {
			if !c.Zero {
				if _, ok := idx[c.Hash]; !ok {
					idx[c.Hash] = struct{ file, idx int }{fi, ci}
				}
			}
		}
	}
	return idx
}

// diff expresses chunks as copies of runs of base and listed chunks:
// each chunk the base holds starts a run that goes on for as long as the
// two lists agree.
func diff(chunks []Chunk, base *Manifest, idx baseIndex) []op {
	var ops []op
	for i := 0; i < len(chunks); {
		c := chunks[i]
		at, ok := idx[c.Hash]
		if c.Zero || !ok {
			if len(ops) == 0 || ops[len(ops)-1].copy {
				ops = append(ops, op{})
			}
			last := &ops[len(ops)-1]
			last.chunks = append(last.chunks, c)
			last.count++
			i++
			continue
		}
		bc := base.Files[at.file].Chunks
		n := 1
		for i+n < len(chunks) && at.idx+n < len(bc) && chunks[i+n] == bc[at.idx+n] {
			n++
		}
		ops = append(ops, op{copy: true, file: at.file, start: at.idx, count: n})
		i += n
	}
	return ops
}

func encodeOps(ops []op) string {
	var b []byte
	for _, o := range ops {
		if o.copy {
			b = binary.AppendUvarint(b, uint64(o.count)<<1|1)
			b = binary.AppendUvarint(b, uint64(o.file))
			b = binary.AppendUvarint(b, uint64(o.start))
			continue
		}
		b = binary.AppendUvarint(b, uint64(o.count)<<1)
		b = appendChunks(b, o.chunks)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// uvarint reads a varint in its shortest form.
func uvarint(b []byte) (uint64, int, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, 0, fmt.Errorf("bad varint")
	}
	if n != len(binary.AppendUvarint(nil, v)) {
		return 0, 0, fmt.Errorf("varint not minimally encoded")
	}
	return v, n, nil
}

// decodeOps reads a file's operations; the sizes of listed chunks must not
// pass size (the copies are checked when the manifest is resolved).
func decodeOps(s string, size int64) ([]op, error) {
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, err
	}
	var ops []op
	var listed int64
	var total int // chunks, all operations
	for len(b) > 0 {
		v, n, err := uvarint(b)
		if err != nil {
			return nil, err
		}
		b = b[n:]
		o := op{copy: v&1 == 1, count: int(v >> 1)}
		if v>>1 == 0 || v>>1 > maxChunksPerFile {
			return nil, fmt.Errorf("an operation on %d chunks", v>>1)
		}
		total += o.count
		if total > maxChunksPerFile {
			return nil, fmt.Errorf("more than %d chunks", maxChunksPerFile)
		}
		if o.copy {
			var f, st uint64
			if f, n, err = uvarint(b); err == nil {
				b = b[n:]
				st, n, err = uvarint(b)
			}
			if err != nil {
				return nil, err
			}
			b = b[n:]
			if f >= maxFiles || st > maxChunksPerFile {
				return nil, fmt.Errorf("a copy of file %d from chunk %d", f, st)
			}
			o.file, o.start = int(f), int(st)
		} else {
			if len(ops) > 0 && !ops[len(ops)-1].copy {
				return nil, fmt.Errorf("two lists of chunks in a row")
			}
			for range o.count {
				c, n, err := readChunk(b)
				if err != nil {
					return nil, err
				}
				b = b[n:]
				listed += int64(c.Size)
				if listed > size {
					return nil, fmt.Errorf("chunks add up to more than its size %d", size)
				}
				o.chunks = append(o.chunks, c)
			}
		}
		ops = append(ops, o)
	}
	return ops, nil
}

// maxChunksPerFile bounds what an operation may name (a file of
// maxChunkSize chunks is never near it; it bounds allocation).
const maxChunksPerFile = 1 << 24

// resolve fills in the chunk lists of a manifest decoded over base (the
// resolved manifest m.Base names), checking every copy against it.
func (m *Manifest) resolve(base *Manifest) error {
	if m.ops == nil {
		return nil
	}
	if base.ops != nil {
		return fmt.Errorf("base %s not resolved", m.Base)
	}
	if base.depth+1 >= maxBaseDepth {
		return fmt.Errorf("more than %d manifests under it", maxBaseDepth-1)
	}
	for i := range m.Files {
		f := &m.Files[i]
		var cs []Chunk
		var total int64
		for _, o := range m.ops[i] {
			part := o.chunks
			if o.copy {
				if o.file >= len(base.Files) || o.start+o.count > len(base.Files[o.file].Chunks) {
					return fmt.Errorf("file %q: a copy of chunks %d+%d of file %d, which its base does not have", f.Name, o.start, o.count, o.file)
				}
				part = base.Files[o.file].Chunks[o.start : o.start+o.count]
			}
			for _, c := range part {
				total += int64(c.Size)
			}
			if total > f.Size {
				return fmt.Errorf("file %q: chunks add up to more than its size %d", f.Name, f.Size)
			}
			cs = append(cs, part...)
		}
		if total != f.Size {
			return fmt.Errorf("file %q: chunks add up to %d, its size is %d", f.Name, total, f.Size)
		}
		f.Chunks = cs
	}
	m.ops, m.depth = nil, base.depth+1
	// Its chunks in the base's packs are read from there.
	if len(base.locs) > 0 {
		if m.locs == nil {
			m.locs = make(map[Hash]loc)
		}
		for _, h := range m.Hashes() {
			if _, ok := m.locs[h]; !ok {
				if l, ok := base.locs[h]; ok {
					m.locs[h] = l
				}
			}
		}
	}
	return nil
}

// ownHashes returns the stored chunks the manifest itself lists: all of
// them when it has no base, else those its operations list (the rest are
// its base's).
func (m *Manifest) ownHashes() []Hash {
	if m.ops == nil {
		return m.Hashes()
	}
	seen := make(map[Hash]bool)
	var out []Hash
	for _, ops := range m.ops {
		for _, o := range ops {
			for _, c := range o.chunks {
				if !c.Zero && !seen[c.Hash] {
					seen[c.Hash] = true
					out = append(out, c.Hash)
				}
			}
		}
	}
	return out
}
