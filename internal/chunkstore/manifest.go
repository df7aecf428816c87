package chunkstore

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Limits on what a manifest may describe. They bound what a manifest read
// from the store can make a reader allocate.
const (
	manifestVersion  = 1 // a full chunk list per file
	baseVersion      = 2 // over a base manifest (base.go)
	packVersion      = 3 // its new chunks in pack files (pack.go), flat or over a base
	maxBaseDepth     = 8 // manifests under one, its base's bases included
	maxManifestBytes = 64 << 20
	maxFiles         = 1024
	maxChunkSize     = 16 << 20
	maxNameLen       = 255
)

// Manifest describes one image directory: its files, each as an ordered
// list of chunks, and the caller's metadata. Immutable once built; safe for
// concurrent reads.
type Manifest struct {
	Chunking Chunking
	Files    []File            // sorted by Name
	Meta     map[string]string // the caller's (template artifact, runsc build)
	// Base is the root of the manifest this one was encoded over, zero for
	// none (base.go). Files always lists every chunk once the manifest is
	// resolved; Store.Manifest resolves it.
	Base Hash
	// Packs are the pack files this manifest's export wrote its new chunks
	// into (pack.go); non-nil (empty if it wrote none) makes the encoding
	// version 3. Nil for versions 1 and 2: every chunk an object of its own.
	Packs []Pack

	depth int          // manifests under this one (0: no base)
	ops   [][]op       // per file, until resolved: what Decode read of a manifest over a base
	locs  map[Hash]loc // where its packed chunks are, its bases' once resolved
}

// File is one regular file of an image directory.
type File struct {
	Name   string      // a plain file name, no directories
	Size   int64       // bytes; the sizes of Chunks add up to it
	Mode   fs.FileMode // permission bits only
	Chunks []Chunk
}

// Chunk is one piece of a file: Size bytes that hash to Hash, or Size zero
// bytes (Zero, no Hash), which are never stored.
type Chunk struct {
	Size int
	Zero bool
	Hash Hash
}

// Chunking records how files were cut; imports do not need it, it tells
// which exports share chunks.
type Chunking struct {
	Alg string `json:"alg"`
	Min int    `json:"min"`
	Avg int    `json:"avg"`
	Max int    `json:"max"`
}

// Bytes is the total size of the manifest's files.
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// Hashes returns the distinct hashes of the manifest's stored (non-zero)
// chunks, in first-use order.
func (m *Manifest) Hashes() []Hash {
	seen := make(map[Hash]bool)
	var out []Hash
	for _, f := range m.Files {
		for _, c := range f.Chunks {
			if !c.Zero && !seen[c.Hash] {
				seen[c.Hash] = true
				out = append(out, c.Hash)
			}
		}
	}
	return out
}

type wireManifest struct {
	Version  int               `json:"version"`
	Hash     string            `json:"hash"`
	Base     string            `json:"base,omitempty"`
	Chunking Chunking          `json:"chunking"`
	Packs    []wirePack        `json:"packs,omitempty"`
	Files    []wireFile        `json:"files"`
	Meta     map[string]string `json:"meta"`
}

type wireFile struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	Mode   uint32 `json:"mode"`
	Chunks string `json:"chunks"`
}

// Encode returns the manifest's canonical encoding and its root (the hash
// of that encoding). It fails with ErrInvalidArgument on a manifest that
// Decode would refuse.
// The encoding lists every chunk of every file (version 1); EncodeOver
// writes one over a base.
func (m *Manifest) Encode() ([]byte, Hash, error) {
	return m.encode(nil, Hash{})
}

// EncodeOver returns the manifest's encoding over base (resolved, as
// Store.Manifest returns it), whose root is baseRoot: each file as runs of
// base's chunks and the chunks base lacks. The result's root is another
// than Encode's; both describe the same image.
func (m *Manifest) EncodeOver(base *Manifest, baseRoot Hash) ([]byte, Hash, error) {
	if base == nil {
		return nil, Hash{}, errdefs.New(errdefs.ErrInvalidArgument, "manifest: no base")
	}
	return m.encode(base, baseRoot)
}

// encode writes the manifest flat (base nil) or over base, whose root is
// baseRoot and which must be resolved.
func (m *Manifest) encode(base *Manifest, baseRoot Hash) ([]byte, Hash, error) {
	w := wireManifest{Version: manifestVersion, Hash: HashAlg, Chunking: m.Chunking, Files: []wireFile{}, Meta: m.Meta}
	if w.Meta == nil {
		w.Meta = map[string]string{}
	}
	if m.ops != nil {
		return nil, Hash{}, errdefs.New(errdefs.ErrInvalidArgument, "manifest: not resolved over its base %s", m.Base)
	}
	var idx baseIndex
	if base != nil {
		if base.ops != nil {
			return nil, Hash{}, errdefs.New(errdefs.ErrInvalidArgument, "manifest: base %s not resolved", baseRoot)
		}
		if base.depth+1 >= maxBaseDepth {
			return nil, Hash{}, errdefs.New(errdefs.ErrInvalidArgument, "manifest: base %s has %d bases under it, at most %d", baseRoot, base.depth, maxBaseDepth-1)
		}
		w.Version, w.Base, idx = baseVersion, baseRoot.String(), indexBase(base)
	}
	if m.Packs != nil {
		if len(m.Packs) > maxPacks {
			return nil, Hash{}, errdefs.New(errdefs.ErrInvalidArgument, "manifest: %d packs, more than %d", len(m.Packs), maxPacks)
		}
		for _, p := range m.Packs {
			if p.ID != newPack(p.Chunks).ID || len(p.Chunks) == 0 || p.Bytes() > maxPackBytes {
				return nil, Hash{}, errdefs.New(errdefs.ErrInvalidArgument, "manifest: pack %s: its name is not its chunk list's hash, or it is empty or too large", p.ID)
			}
		}
		w.Version, w.Packs = packVersion, encodePacks(m.Packs)
	}
	for _, f := range m.Files {
		var total int64
		for _, c := range f.Chunks {
			if c.Size <= 0 || c.Size > maxChunkSize {
				return nil, Hash{}, errdefs.New(errdefs.ErrInvalidArgument, "manifest: file %q: a chunk of %d bytes", f.Name, c.Size)
			}
			total += int64(c.Size)
		}
		if total != f.Size {
			return nil, Hash{}, errdefs.New(errdefs.ErrInvalidArgument, "manifest: file %q: chunks add up to %d, its size is %d", f.Name, total, f.Size)
		}
		chunks := ""
		if base != nil {
			chunks = encodeOps(diff(f.Chunks, base, idx))
		} else {
			chunks = encodeChunks(f.Chunks)
		}
		w.Files = append(w.Files, wireFile{Name: f.Name, Size: f.Size, Mode: uint32(f.Mode), Chunks: chunks})
	}
	if err := w.validate(); err != nil {
		return nil, Hash{}, err
	}
	b, err := json.Marshal(w)
	if err != nil {
		return nil, Hash{}, fmt.Errorf("encoding manifest: %w", err)
	}
	if len(b) > maxManifestBytes {
		return nil, Hash{}, errdefs.New(errdefs.ErrInvalidArgument, "manifest of %d bytes is larger than %d", len(b), maxManifestBytes)
	}
	return b, Sum(b), nil
}

// Decode reads a manifest in canonical form and checks that it hashes to
// root (ErrCorrupt otherwise). Bytes that hash right but do not describe a
// valid manifest are ErrCorrupt too: the store holds something no Encode
// wrote. A manifest over a base comes back unresolved: Base set, its Files
// without chunks; Store.Manifest reads its bases and resolves it.
func Decode(b []byte, root Hash) (*Manifest, error) {
	if err := verify("manifest", root, b); err != nil {
		return nil, err
	}
	m, err := decode(b)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %v: %w", root, err, errdefs.ErrCorrupt)
	}
	return m, nil
}

func decode(b []byte) (*Manifest, error) {
	if len(b) > maxManifestBytes {
		return nil, fmt.Errorf("%d bytes, more than %d", len(b), maxManifestBytes)
	}
	var w wireManifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return nil, err
	}
	if err := w.validate(); err != nil {
		return nil, err
	}
	m := &Manifest{Chunking: w.Chunking, Meta: w.Meta}
	if w.Version == packVersion {
		packs, locs, err := decodePacks(w.Packs)
		if err != nil {
			return nil, err
		}
		m.Packs, m.locs = packs, locs
	}
	if w.Base != "" {
		m.Base, _ = ParseHash(w.Base) // validate checked it
		m.ops = make([][]op, len(w.Files))
	}
	for i, wf := range w.Files {
		if m.ops != nil {
			ops, err := decodeOps(wf.Chunks, wf.Size)
			if err != nil {
				return nil, fmt.Errorf("file %q: %w", wf.Name, err)
			}
			m.ops[i] = ops
			m.Files = append(m.Files, File{Name: wf.Name, Size: wf.Size, Mode: fs.FileMode(wf.Mode)})
			continue
		}
		cs, err := decodeChunks(wf.Chunks, wf.Size)
		if err != nil {
			return nil, fmt.Errorf("file %q: %w", wf.Name, err)
		}
		m.Files = append(m.Files, File{Name: wf.Name, Size: wf.Size, Mode: fs.FileMode(wf.Mode), Chunks: cs})
	}
	// Canonical: the one encoding of what was read.
	again, err := json.Marshal(w)
	if err != nil || !bytes.Equal(again, b) {
		return nil, fmt.Errorf("not in canonical form")
	}
	return m, nil
}

func (w *wireManifest) validate() error {
	bad := func(format string, args ...any) error {
		return errdefs.New(errdefs.ErrInvalidArgument, "manifest: "+format, args...)
	}
	switch w.Version {
	case manifestVersion:
		if w.Base != "" {
			return bad("a base in a version %d manifest", w.Version)
		}
	case baseVersion, packVersion:
		if w.Base == "" && w.Version == baseVersion {
			return bad("no base in a version %d manifest", w.Version)
		}
		if h, err := ParseHash(w.Base); w.Base != "" && (err != nil || h.String() != w.Base) {
			return bad("base %q: want a root in lower-case hex", w.Base)
		}
	default:
		return bad("version %d, want %d, %d or %d", w.Version, manifestVersion, baseVersion, packVersion)
	}
	if w.Version != packVersion && w.Packs != nil {
		return bad("packs in a version %d manifest", w.Version)
	}
	if len(w.Packs) > maxPacks {
		return bad("%d packs, more than %d", len(w.Packs), maxPacks)
	}
	if w.Hash != HashAlg {
		return bad("hash %q, want %q", w.Hash, HashAlg)
	}
	if w.Meta == nil {
		return bad("no meta object")
	}
	if len(w.Files) > maxFiles {
		return bad("%d files, more than %d", len(w.Files), maxFiles)
	}
	for i, f := range w.Files {
		if err := ValidName(f.Name); err != nil {
			return err
		}
		if i > 0 && w.Files[i-1].Name >= f.Name {
			return bad("files not sorted by name, or a name twice (%q)", f.Name)
		}
		if f.Size < 0 || f.Mode&^0o777 != 0 {
			return bad("file %q: size %d, mode %o", f.Name, f.Size, f.Mode)
		}
	}
	return nil
}

// ValidName checks that name is a plain file name an image may hold.
func ValidName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > maxNameLen ||
		strings.ContainsAny(name, "/\\\x00") || strings.HasPrefix(name, ".") {
		return errdefs.New(errdefs.ErrInvalidArgument, "image file name %q: want a plain name, not hidden, no slashes", name)
	}
	return nil
}

func encodeChunks(cs []Chunk) string {
	return base64.StdEncoding.EncodeToString(appendChunks(make([]byte, 0, len(cs)*(binary.MaxVarintLen64+len(Hash{}))), cs))
}

// appendChunks appends a chunk list's binary form: per chunk,
// uvarint(size<<1 | zero), then the hash unless zero.
func appendChunks(b []byte, cs []Chunk) []byte {
	for _, c := range cs {
		v := uint64(c.Size) << 1
		if c.Zero {
			b = binary.AppendUvarint(b, v|1)
			continue
		}
		b = binary.AppendUvarint(b, v)
		b = append(b, c.Hash[:]...)
	}
	return b
}

// readChunk reads one chunk of a list's binary form and its length.
func readChunk(b []byte) (Chunk, int, error) {
	// The shortest encoding only, so that one list has one string.
	v, n, err := uvarint(b)
	if err != nil {
		return Chunk{}, 0, fmt.Errorf("chunk size: %w", err)
	}
	c := Chunk{Size: int(v >> 1), Zero: v&1 == 1}
	if v>>1 == 0 || v>>1 > maxChunkSize {
		return Chunk{}, 0, fmt.Errorf("chunk of %d bytes (1 to %d)", v>>1, maxChunkSize)
	}
	if !c.Zero {
		if len(b) < n+len(c.Hash) {
			return Chunk{}, 0, fmt.Errorf("chunk list cut short")
		}
		copy(c.Hash[:], b[n:])
		n += len(c.Hash)
	}
	return c, n, nil
}

func decodeChunks(s string, size int64) ([]Chunk, error) {
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, err
	}
	var cs []Chunk
	var total int64
	for len(b) > 0 {
		c, n, err := readChunk(b)
		if err != nil {
			return nil, err
		}
		b = b[n:]
		total += int64(c.Size)
		if total > size {
			return nil, fmt.Errorf("chunks add up to more than its size %d", size)
		}
		cs = append(cs, c)
	}
	if total != size {
		return nil, fmt.Errorf("chunks add up to %d, its size is %d", total, size)
	}
	return slices.Clip(cs), nil
}
