package chunkstore

import (
	"bytes"
	"errors"
	"math/rand/v2"
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
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b, Sum(b))
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) {
				t.Fatalf("a bad manifest is not ErrCorrupt: %v", err)
			}
			return
		}
		again, root, err := m.Encode()
		if err != nil || root != Sum(b) || !bytes.Equal(again, b) {
			t.Fatalf("a manifest Decode accepted does not encode back: %v", err)
		}
	})
}
