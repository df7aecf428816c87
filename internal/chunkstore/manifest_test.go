package chunkstore

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cellfork/cellfork/internal/errdefs"
)

func sampleManifest() *Manifest {
	return &Manifest{
		Chunking: DefaultChunking,
		Files: []File{
			{Name: "checkpoint.img", Size: 10, Mode: 0o644, Chunks: []Chunk{{Size: 10, Hash: Sum([]byte("0123456789"))}}},
			{Name: "empty.img", Size: 0, Mode: 0o600},
			{Name: "pages.img", Size: 300000, Mode: 0o644, Chunks: []Chunk{{Size: 100000, Hash: Sum([]byte("a"))}, {Size: 150000, Zero: true}, {Size: 50000, Hash: Sum([]byte("b"))}}},
		},
		Meta: map[string]string{"runsc": "v1", "artifact": "x<y>&z"},
	}
}

func TestManifestRoundTrip(t *testing.T) {
	m := sampleManifest()
	b, root, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b, root)
	if err != nil {
		t.Fatal(err)
	}
	b2, root2, _ := got.Encode()
	if root2 != root || !bytes.Equal(b, b2) {
		t.Fatalf("re-encoding changed the manifest:\n%s\n%s", b, b2)
	}
	if got.Bytes() != 300010 || len(got.Hashes()) != 3 || got.Files[2].Chunks[1] != (Chunk{Size: 150000, Zero: true}) {
		t.Fatalf("decoded %+v", got)
	}
	// Another root is corrupt, and so is a byte changed.
	if _, err := Decode(b, Sum([]byte("x"))); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("wrong root: %v", err)
	}
	// Bytes that hash right but are not canonical (a space) are refused.
	spaced := bytes.Replace(b, []byte(`"version":1,`), []byte(`"version": 1,`), 1)
	if _, err := Decode(spaced, Sum(spaced)); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("non-canonical manifest: %v", err)
	}
}

func TestManifestRefusesBadOnes(t *testing.T) {
	for name, change := range map[string]func(m *Manifest){
		"unsorted":      func(m *Manifest) { m.Files[0], m.Files[1] = m.Files[1], m.Files[0] },
		"slash":         func(m *Manifest) { m.Files[0].Name = "../checkpoint.img" },
		"hidden":        func(m *Manifest) { m.Files[0].Name = ".x" },
		"size mismatch": func(m *Manifest) { m.Files[0].Size = 11 },
		"zero chunk":    func(m *Manifest) { m.Files[2].Chunks[1].Size = 0 },
		"setuid":        func(m *Manifest) { m.Files[0].Mode |= 0o4000 },
		"huge chunk":    func(m *Manifest) { m.Files[0].Chunks[0].Size = maxChunkSize + 1; m.Files[0].Size = maxChunkSize + 1 },
	} {
		m := sampleManifest()
		change(m)
		if _, _, err := m.Encode(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: encode gave %v, want ErrInvalidArgument", name, err)
		}
	}
}

// The chunk list's encoding is fixed: a change would give every image a
// new root and break reading stored manifests.
func TestChunkListEncoding(t *testing.T) {
	var h Hash
	h[0], h[31] = 0xab, 0xcd
	got := encodeChunks([]Chunk{{Size: 3, Zero: true}, {Size: 200, Hash: h}})
	if cs, err := decodeChunks(got, 203); err != nil || len(cs) != 2 || !cs[0].Zero || cs[1].Hash != h || cs[1].Size != 200 {
		t.Fatalf("decode(encode) = %+v, %v", cs, err)
	}
	if got != "B5ADqwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAM0=" {
		t.Fatalf("chunk list encoding changed: %s", got)
	}
	if _, err := decodeChunks("B5AD", 203); err == nil {
		t.Fatal("a list cut short decoded")
	}
}

// Golden cut points: a change in the chunker (a library upgrade) would
// stop new exports sharing chunks with everything stored before.
func TestChunkingIsStable(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	var sizes []int
	if err := DefaultChunking.Split(bytes.NewReader(data), func(off int64, b []byte) error { sizes = append(sizes, len(b)); return nil }); err != nil {
		t.Fatal(err)
	}
	var h []byte
	for _, s := range sizes {
		h = append(h, byte(s>>16), byte(s>>8), byte(s))
	}
	if got := Sum(h).String()[:16]; got != "0034d28832375066" {
		t.Fatalf("cut points of DefaultChunking changed: %d chunks, sizes %v, digest %s", len(sizes), sizes, got)
	}
}

func FuzzDecode(f *testing.F) {
	b, _, _ := sampleManifest().Encode()
	f.Add(b)
	f.Add([]byte(`{"version":1}`))
	base := sampleManifest()
	_, baseRoot, _ := base.Encode()
	over, _, _ := derived().EncodeOver(base, baseRoot)
	f.Add(over)
	pb, _, _ := packed().Encode()
	f.Add(pb)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b, Sum(b))
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) {
				t.Fatalf("a bad manifest is not ErrCorrupt: %v", err)
			}
			return
		}
		if m.Base != (Hash{}) {
			// Over a base: resolved against the sample, every file's
			// chunks add up to its size, or it is refused.
			if m.resolve(base) != nil {
				return
			}
			for _, f := range m.Files {
				var n int64
				for _, c := range f.Chunks {
					n += int64(c.Size)
				}
				if n != f.Size {
					t.Fatalf("resolved file %q: chunks add up to %d, size %d", f.Name, n, f.Size)
				}
			}
			return
		}
		again, root, err := m.Encode()
		if err != nil || root != Sum(b) || !bytes.Equal(again, b) {
			t.Fatalf("a manifest Decode accepted does not encode back: %v", err)
		}
	})
}

// derived is sampleManifest with checkpoint.img changed and pages.img's
// last chunk replaced: most of it is a copy of the sample's.
func derived() *Manifest {
	m := sampleManifest()
	m.Files = append([]File(nil), m.Files...)
	m.Files[0] = File{Name: "checkpoint.img", Size: 10, Mode: 0o644, Chunks: []Chunk{{Size: 10, Hash: Sum([]byte("9876543210"))}}}
	pages := m.Files[2]
	pages.Chunks = append(append([]Chunk(nil), pages.Chunks[:2]...), Chunk{Size: 50000, Hash: Sum([]byte("c"))})
	m.Files[2] = pages
	m.Meta = map[string]string{"sandbox": "x"}
	return m
}

func TestManifestOverBase(t *testing.T) {
	base := sampleManifest()
	_, baseRoot, err := base.Encode()
	if err != nil {
		t.Fatal(err)
	}
	m := derived()
	b, root, err := m.EncodeOver(base, baseRoot)
	if err != nil {
		t.Fatal(err)
	}
	flat, flatRoot, _ := m.Encode()
	if root == flatRoot || !bytes.Contains(b, []byte(`"version":2,"hash":"blake3-256","base":"`+baseRoot.String()+`"`)) {
		t.Fatalf("encoding over a base:\n%s", b)
	}
	got, err := Decode(b, root)
	if err != nil {
		t.Fatal(err)
	}
	if got.Base != baseRoot || got.ops == nil {
		t.Fatalf("decoded base %s, ops %v", got.Base, got.ops)
	}
	// Before it is resolved it names only the chunks it lists.
	if own := got.ownHashes(); len(own) != 2 {
		t.Fatalf("own chunks %v, want checkpoint.img's and pages.img's last", own)
	}
	if err := got.resolve(base); err != nil {
		t.Fatal(err)
	}
	again, _, _ := got.Encode()
	if !bytes.Equal(again, flat) || got.depth != 1 {
		t.Fatalf("resolved manifest differs from the one encoded:\n%s\n%s", again, flat)
	}
	// Resolved against another base of the right shape but other chunks,
	// the sizes still add up, so only the root catches a wrong base: the
	// store reads a base by its root.
	other := derived()
	other.Files[2].Chunks = other.Files[2].Chunks[:1]
	other.Files[2].Size = 100000
	bad, _ := Decode(b, root)
	if err := bad.resolve(other); err == nil {
		t.Fatal("resolved over a base that lacks the chunks it copies")
	}
}

func TestManifestOverBaseRefusesBadOnes(t *testing.T) {
	base := sampleManifest()
	_, baseRoot, _ := base.Encode()
	b, _, err := derived().EncodeOver(base, baseRoot)
	if err != nil {
		t.Fatal(err)
	}
	var w wireManifest
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	ops := func(parts ...[]byte) string { return base64.StdEncoding.EncodeToString(bytes.Join(parts, nil)) }
	h := Sum([]byte("c"))
	list := append(binary.AppendUvarint([]byte{1 << 1}, 50000<<1), h[:]...)
	for name, change := range map[string]func(w *wireManifest){
		"v1 with a base":  func(w *wireManifest) { w.Version = 1 },
		"v2 without":      func(w *wireManifest) { w.Base = "" },
		"upper-case base": func(w *wireManifest) { w.Base = strings.ToUpper(w.Base) },
		"two lists":       func(w *wireManifest) { w.Files[2].Chunks = ops([]byte{2<<1 | 1, 2, 0}, list, list) },
		"empty copy":      func(w *wireManifest) { w.Files[2].Chunks = ops([]byte{0<<1 | 1, 2, 0}) },
		"long varint":     func(w *wireManifest) { w.Files[2].Chunks = ops([]byte{2<<1 | 1 | 0x80, 0, 2, 0}, list) },
		"cut short":       func(w *wireManifest) { w.Files[2].Chunks = ops([]byte{2<<1 | 1, 2}) },
	} {
		w2 := w
		w2.Files = append([]wireFile(nil), w.Files...)
		change(&w2)
		raw, _ := json.Marshal(w2)
		if _, err := Decode(raw, Sum(raw)); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	// Well formed, but copying past the end of the base's file.
	w2 := w
	w2.Files = append([]wireFile(nil), w.Files...)
	w2.Files[2].Chunks = ops([]byte{3<<1 | 1, 2, 1})
	raw, _ := json.Marshal(w2)
	m, err := Decode(raw, Sum(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.resolve(base); err == nil {
		t.Fatal("resolved a copy past the end of its base's file")
	}
	// A base at the depth limit is refused.
	deep := sampleManifest()
	deep.depth = maxBaseDepth - 1
	if _, _, err := derived().EncodeOver(deep, baseRoot); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("encoding over a base at the depth limit: %v", err)
	}
}
