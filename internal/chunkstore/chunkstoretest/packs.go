package chunkstoretest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/errdefs"
)

// StoredAt returns the object that holds chunk h of the (resolved)
// manifest m and the chunk's offset in it: its pack, or its own object.
func StoredAt(m *chunkstore.Manifest, h chunkstore.Hash) (key string, off int64) {
	if p, off, ok := m.Locate(h); ok {
		return chunkstore.PackKey(p), off
	}
	return chunkstore.ChunkKey(h), 0
}

// PutStored writes data over chunk h of m where the store holds it (a
// corrupt copy in the store).
func PutStored(t testing.TB, b chunkstore.Backend, m *chunkstore.Manifest, h chunkstore.Hash, data []byte) {
	t.Helper()
	key, off := StoredAt(m, h)
	c := context.Background()
	obj := data
	if key != chunkstore.ChunkKey(h) {
		whole, err := b.Get(c, key)
		if err != nil {
			t.Fatal(err)
		}
		obj = slices.Clone(whole)
		copy(obj[off:], data)
	}
	if err := b.Put(c, key, obj); err != nil {
		t.Fatal(err)
	}
}

// flipped returns b with its middle byte changed.
func flipped(b []byte) []byte {
	b = slices.Clone(b)
	b[len(b)/2] ^= 1
	return b
}

// counting counts the reads of a backend (whole and ranged).
type counting struct {
	chunkstore.Backend
	gets, ranges atomic.Int64
}

func (c *counting) Get(ctx context.Context, key string) ([]byte, error) {
	c.gets.Add(1)
	return c.Backend.Get(ctx, key)
}

func (c *counting) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	c.ranges.Add(1)
	return c.Backend.(chunkstore.RangeReader).GetRange(ctx, key, off, n)
}

const smallPacks = 96 << 10

// testPacks: an export with packs writes its chunks into a few pack
// objects and none of its own; a cold import reads them in a few ranged
// reads, fills the cache chunk by chunk, and is byte-exact; an export that
// failed after some of its packs finds them again.
func testPacks(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	imgA.Write(t, filepath.Join(dir, "a"))
	s, _ := NewStoreWith(t, b, false, chunkstore.Options{PackBytes: smallPacks})
	st, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Manifest(ctx(t), st.Root)
	if err != nil {
		t.Fatal(err)
	}
	packs, packBytes := count(t, b, "packs/")
	if n, _ := count(t, b, "chunks/"); n != 0 || st.Packs < 3 || packs != st.Packs || len(m.Packs) != st.Packs || st.Transferred != st.Distinct || packBytes != st.TransferredBytes {
		t.Fatalf("packed export: %s; %d packs (%d bytes) and %d chunks in the store", &st, packs, packBytes, n)
	}
	var phases []string
	for _, p := range st.Phases {
		phases = append(phases, p.Name)
	}
	if !slices.Equal(phases, []string{"export.chunk", "export.check", "export.upload", "export.manifest"}) {
		t.Fatalf("packed export phases: %v", phases)
	}
	for _, p := range m.Packs {
		if p.Bytes() > smallPacks && len(p.Chunks) > 1 {
			t.Fatalf("a pack of %d bytes in %d chunks, more than %d", p.Bytes(), len(p.Chunks), smallPacks)
		}
	}
	for _, h := range m.Hashes() {
		if _, _, ok := m.Locate(h); !ok {
			t.Fatalf("chunk %s is in no pack", h)
		}
	}

	// Cold, with a cache: one ranged read per pack (each is under 4 MiB
	// and whole), the manifest one get; every chunk cached on its own.
	cb := &counting{Backend: b}
	cold, cache := NewStoreWith(t, cb, true, chunkstore.Options{PackBytes: smallPacks})
	ist, err := cold.Import(ctx(t), st.Root, filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "out"))
	if ist.Transferred != st.Distinct || ist.Packs != st.Packs || cb.ranges.Load() != int64(st.Packs) || cb.gets.Load() != 1 {
		t.Fatalf("cold import: %s; %d ranged reads, %d gets", &ist, cb.ranges.Load(), cb.gets.Load())
	}
	cache.Flush() // written behind the import
	for _, h := range m.Hashes() {
		if _, err := os.Stat(filepath.Join(cache.Dir(), filepath.FromSlash(chunkstore.ChunkKey(h)))); err != nil {
			t.Fatalf("chunk %s not cached: %v", h, err)
		}
	}
	again, err := cold.Import(ctx(t), st.Root, filepath.Join(dir, "again"))
	if err != nil || again.Transferred != 0 || again.Packs != 0 {
		t.Fatalf("import from the warm cache: %s, %v", &again, err)
	}
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "again"))
	// Without a cache: every chunk read from its pack.
	if _, err := s.Import(ctx(t), st.Root, filepath.Join(dir, "uncached")); err != nil {
		t.Fatal(err)
	}
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "uncached"))

	// The same image again: the same packs, found, nothing uploaded.
	st2, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil || st2.Root != st.Root || st2.Transferred != 0 || st2.Present != st.Distinct {
		t.Fatalf("export again: %s, %v", &st2, err)
	}
	// An export that failed after all but one of its packs (no manifest):
	// run again, it uploads that one.
	if err := b.Delete(ctx(t), chunkstore.ManifestKey(st.Root)); err != nil {
		t.Fatal(err)
	}
	lost := m.Packs[1]
	if err := b.Delete(ctx(t), chunkstore.PackKey(lost.ID)); err != nil {
		t.Fatal(err)
	}
	st3, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil || st3.Root != st.Root || st3.Transferred != len(lost.Chunks) || st3.TransferredBytes != lost.Bytes() {
		t.Fatalf("export after a failed one: %s, %v; want pack %s (%d chunks) uploaded again", &st3, err, lost.ID, len(lost.Chunks))
	}
	fresh, _ := NewStoreWith(t, b, true, chunkstore.Options{PackBytes: smallPacks})
	if _, err := fresh.Import(ctx(t), st.Root, filepath.Join(dir, "out3")); err != nil {
		t.Fatal(err)
	}
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "out3"))

	// The default pack size: the image is one pack.
	def, _ := NewStoreWith(t, b, false, chunkstore.Options{PackBytes: chunkstore.DefaultPackBytes})
	dst, err := def.Export(ctx(t), filepath.Join(dir, "a"), map[string]string{"k": "v"})
	if err != nil || dst.Packs != 1 {
		t.Fatalf("export with the default pack size: %s, %v", &dst, err)
	}
}

// testCorruptPack: a changed byte in a pack, a pack cut short, a pack that
// is gone: the import fails (ErrCorrupt, ErrNotFound), leaves nothing,
// caches no bad chunk; a pack gone whose chunks are stored as objects of
// their own reads those; with the pack put back it imports.
func testCorruptPack(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	imgA.Write(t, filepath.Join(dir, "a"))
	s, _ := NewStoreWith(t, b, false, chunkstore.Options{PackBytes: smallPacks})
	st, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Manifest(ctx(t), st.Root)
	if err != nil {
		t.Fatal(err)
	}
	victim := m.Files[2].Chunks[3] // pages.img
	key, off := StoredAt(m, victim.Hash)
	good, err := b.Get(ctx(t), key)
	if err != nil {
		t.Fatal(err)
	}
	bad := slices.Clone(good)
	bad[off+int64(victim.Size)-1] ^= 0x80
	for name, obj := range map[string][]byte{"a byte changed": bad, "cut short": good[:off+int64(victim.Size)/2]} {
		if err := b.Put(ctx(t), key, obj); err != nil {
			t.Fatal(err)
		}
		for _, cached := range []bool{true, false} {
			cold, cache := NewStoreWith(t, b, cached, chunkstore.Options{PackBytes: smallPacks})
			if _, err := cold.Import(ctx(t), st.Root, filepath.Join(dir, "out")); !errors.Is(err, errdefs.ErrCorrupt) {
				t.Fatalf("%s, cache %v: %v, want ErrCorrupt", name, cached, err)
			}
			if cache != nil {
				cache.Flush()
				if _, err := os.Stat(filepath.Join(cache.Dir(), filepath.FromSlash(chunkstore.ChunkKey(victim.Hash)))); err == nil {
					t.Fatalf("%s: the bad chunk was cached", name)
				}
			}
			noLeftovers(t, dir, "a")
		}
	}
	if err := b.Delete(ctx(t), key); err != nil {
		t.Fatal(err)
	}
	cold, _ := NewStoreWith(t, b, true, chunkstore.Options{PackBytes: smallPacks})
	if _, err := cold.Import(ctx(t), st.Root, filepath.Join(dir, "out")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a pack that is gone: %v, want ErrNotFound", err)
	}
	noLeftovers(t, dir, "a")
	// The pack gone but its chunks stored as objects of their own (a
	// peer's handler serves those): read from there.
	loose, _ := NewStoreWith(t, b, false, chunkstore.Options{PackBytes: -1})
	if _, err := loose.Export(ctx(t), filepath.Join(dir, "a"), nil); err != nil {
		t.Fatal(err)
	}
	cold, _ = NewStoreWith(t, b, true, chunkstore.Options{PackBytes: smallPacks})
	if _, err := cold.Import(ctx(t), st.Root, filepath.Join(dir, "from-chunks")); err != nil {
		t.Fatalf("a pack gone, its chunks stored: %v", err)
	}
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "from-chunks"))
	os.RemoveAll(filepath.Join(dir, "from-chunks"))
	if err := b.Put(ctx(t), key, good); err != nil {
		t.Fatal(err)
	}
	if _, err := cold.Import(ctx(t), st.Root, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "out"))
}

// testGCPacks: a collection deletes the packs of the manifests it drops
// and the packs no manifest names (an export that never wrote its
// manifest) once older than the grace period, and keeps the packs of a
// kept manifest and of its bases (a base no one names as live).
func testGCPacks(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	imgA.Write(t, filepath.Join(dir, "a"))
	imgB.Write(t, filepath.Join(dir, "x"))
	derive(t, filepath.Join(dir, "a"), filepath.Join(dir, "d"), 0x3c, 4096*20, 4096*150)
	s, _ := NewStoreWith(t, b, false, chunkstore.Options{PackBytes: smallPacks})
	a, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.ExportOver(ctx(t), filepath.Join(dir, "d"), nil, a.Root)
	if err != nil {
		t.Fatal(err)
	}
	x, err := s.Export(ctx(t), filepath.Join(dir, "x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Base != a.Root || d.Packs == 0 || d.Packs >= a.Packs {
		t.Fatalf("export over a: %s (a: %s)", &d, &a)
	}
	orphan := chunkstore.Sum([]byte("an export that never wrote its manifest"))
	if err := b.Put(ctx(t), chunkstore.PackKey(orphan), bytes.Repeat([]byte{7}, 1000)); err != nil {
		t.Fatal(err)
	}
	packsOf := func(root chunkstore.Hash) []string {
		body, err := b.Get(ctx(t), chunkstore.ManifestKey(root))
		if err != nil {
			t.Fatal(err)
		}
		m, err := chunkstore.Decode(body, root)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, p := range m.Packs {
			keys = append(keys, chunkstore.PackKey(p.ID))
		}
		return keys
	}
	aPacks, dPacks, xPacks := packsOf(a.Root), packsOf(d.Root), packsOf(x.Root)
	has := func(keys []string) (n int) {
		found, err := b.Has(ctx(t), keys)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range found {
			if f {
				n++
			}
		}
		return n
	}
	only := func(roots ...chunkstore.Hash) chunkstore.Roots {
		return chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return roots, nil })
	}
	total := len(aPacks) + len(dPacks) + len(xPacks) + 1
	// Within the grace period nothing goes, the orphan included.
	st, err := s.GC(ctx(t), only(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if st.Packs != total || st.DeletedPacks != 0 || st.DeletedManifests != 0 {
		t.Fatalf("gc within the grace period: %+v, want %d packs, none deleted", st, total)
	}
	// d live: d's packs and a's (its base) kept, x's and the orphan gone.
	st, err = s.GC(ctx(t), only(d.Root), 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.DeletedManifests != 1 || st.DeletedPacks != len(xPacks)+1 || has(aPacks) != len(aPacks) || has(dPacks) != len(dPacks) ||
		has(xPacks) != 0 || has([]string{chunkstore.PackKey(orphan)}) != 0 {
		t.Fatalf("gc keeping d: %+v; packs of a %d/%d, d %d/%d, x %d/%d", st, has(aPacks), len(aPacks), has(dPacks), len(dPacks), has(xPacks), len(xPacks))
	}
	cold, _ := NewStoreWith(t, b, true, chunkstore.Options{PackBytes: smallPacks})
	for n, r := range map[string]chunkstore.Hash{"a": a.Root, "d": d.Root} {
		out := filepath.Join(dir, "out-"+n)
		if _, err := cold.Import(ctx(t), r, out); err != nil {
			t.Fatalf("%s after a gc that kept d: %v", n, err)
		}
		Equal(t, filepath.Join(dir, n), out)
	}
	// Nothing live: every pack goes with its manifest.
	if _, err := s.GC(ctx(t), only(), 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := stored(t, b); n != 0 {
		t.Fatalf("%d packs or chunks left with none live", n)
	}
}

// testPacksOverLoose: stores with and without packs share one backend.
// Version 1 and 2 manifests (every chunk its own object) still import
// through a store with packs; a packed export over a version 2 manifest
// reads its base's chunks as objects and packs the rest; an export
// without packs over a packed base (version 2 over version 3) reads the
// base's chunks from its packs; a collection keeps all of them for the
// last one.
func testPacksOverLoose(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	imgA.Write(t, filepath.Join(dir, "a"))
	derive(t, filepath.Join(dir, "a"), filepath.Join(dir, "d"), 0x21, 4096*40)
	derive(t, filepath.Join(dir, "d"), filepath.Join(dir, "d2"), 0x42, 4096*90)
	derive(t, filepath.Join(dir, "d2"), filepath.Join(dir, "d3"), 0x63, 4096*120)
	loose, _ := NewStoreWith(t, b, false, chunkstore.Options{PackBytes: -1})
	packs, _ := NewStoreWith(t, b, false, chunkstore.Options{PackBytes: smallPacks})
	a, err := loose.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := loose.ExportOver(ctx(t), filepath.Join(dir, "d"), nil, a.Root)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := packs.ExportOver(ctx(t), filepath.Join(dir, "d2"), nil, d.Root)
	if err != nil {
		t.Fatal(err)
	}
	d3, err := loose.ExportOver(ctx(t), filepath.Join(dir, "d3"), nil, d2.Root)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[chunkstore.Hash]string{a.Root: `{"version":1,`, d.Root: `{"version":2,`, d2.Root: `{"version":3,`, d3.Root: `{"version":2,`} {
		body, err := b.Get(ctx(t), chunkstore.ManifestKey(name))
		if err != nil || !bytes.HasPrefix(body, []byte(want)) {
			t.Fatalf("manifest %s: %.14s, want %s (%v)", name, body, want, err)
		}
	}
	if d2.Base != d.Root || d2.Packs == 0 || d2.Transferred*2 > d2.Distinct || d3.Base != d2.Root {
		t.Fatalf("packed over loose: %s; loose over packed: %s", &d2, &d3)
	}
	// Only d3 live: it and its bases, their chunks and packs, stay.
	if _, err := packs.GC(ctx(t), chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) {
		return []chunkstore.Hash{d3.Root}, nil
	}), 0); err != nil {
		t.Fatal(err)
	}
	for _, st := range []*chunkstore.Store{packs, loose} {
		cold, _ := NewStoreWith(t, b, true, chunkstore.Options{PackBytes: smallPacks})
		if st == loose {
			cold, _ = NewStoreWith(t, b, false, chunkstore.Options{PackBytes: -1})
		}
		for n, r := range map[string]chunkstore.Hash{"a": a.Root, "d": d.Root, "d2": d2.Root, "d3": d3.Root} {
			out := filepath.Join(dir, "out-"+n)
			if _, err := cold.Import(ctx(t), r, out); err != nil {
				t.Fatalf("%s: %v", n, err)
			}
			Equal(t, filepath.Join(dir, n), out)
			os.RemoveAll(out)
		}
	}
}

// testGCAgainstRewrite: a dead manifest older than the grace period that
// an export writes again (the same image, meta and base: the same root)
// between the collection's mark and its sweep is kept, and what it names.
func (cs suite) testGCAgainstRewrite(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	imgA.Write(t, filepath.Join(dir, "a"))
	plain, _ := cs.store(t, b, false)
	first, err := plain.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	const grace = 1100 * time.Millisecond // above S3's one-second times
	time.Sleep(2 * grace)
	var again chunkstore.Stats
	h := &hooked{Backend: b, prefix: "chunks/", onList: func() {
		var err error
		if again, err = plain.Export(ctx(t), filepath.Join(dir, "a"), nil); err != nil {
			t.Error(err)
		}
	}}
	s, _ := cs.store(t, h, false)
	none := chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return nil, nil })
	st, err := s.GC(ctx(t), none, grace)
	if err != nil {
		t.Fatal(err)
	}
	if again.Root != first.Root || st.DeletedManifests != 0 || deleted(st) != 0 {
		t.Fatalf("gc against a manifest written again (%s, first %s): %+v", again.Root, first.Root, st)
	}
	if _, err := plain.Import(ctx(t), first.Root, filepath.Join(dir, "out")); err != nil {
		t.Fatalf("the manifest written again, after gc: %v", err)
	}
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "out"))
}
