package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// packed is sampleManifest with its stored chunks in two packs.
func packed() *Manifest {
	m := sampleManifest()
	hs := m.Hashes()
	m.Packs = makePacks(hs, func(h Hash) int {
		for _, f := range m.Files {
			for _, c := range f.Chunks {
				if c.Hash == h && !c.Zero {
					return c.Size
				}
			}
		}
		return 0
	}, 150000)
	return m
}

func TestPackedManifest(t *testing.T) {
	m := packed()
	if len(m.Packs) != 2 || len(m.Packs[0].Chunks) != 2 || len(m.Packs[1].Chunks) != 1 {
		t.Fatalf("packs of 150000 bytes: %+v", m.Packs)
	}
	b, root, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte(`{"version":3,"hash":"blake3-256","chunking":`)) || !bytes.Contains(b, []byte(`"packs":[{"id":"`+m.Packs[0].ID.String())) {
		t.Fatalf("a packed manifest: %s", b)
	}
	got, err := Decode(b, root)
	if err != nil {
		t.Fatal(err)
	}
	again, root2, _ := got.Encode()
	if root2 != root || !bytes.Equal(again, b) {
		t.Fatalf("re-encoding changed it:\n%s\n%s", b, again)
	}
	// Every stored chunk is located: the first pack holds the 10-byte
	// chunk then "a" (100000 bytes), the second "b".
	want := map[Hash]struct {
		pack int
		off  int64
	}{Sum([]byte("0123456789")): {0, 0}, Sum([]byte("a")): {0, 10}, Sum([]byte("b")): {1, 0}}
	for h, w := range want {
		p, off, ok := got.Locate(h)
		if !ok || p != m.Packs[w.pack].ID || off != w.off {
			t.Fatalf("chunk %s at %s+%d (%v), want pack %d+%d", h, p, off, ok, w.pack, w.off)
		}
	}
	// None wrote an empty pack list as "packs":[]; it is still version 3.
	m.Packs = []Pack{}
	b, root, err = m.Encode()
	if err != nil || bytes.Contains(b, []byte("packs")) || !bytes.HasPrefix(b, []byte(`{"version":3,`)) {
		t.Fatalf("no packs: %s, %v", b, err)
	}
	if got, err := Decode(b, root); err != nil || got.Packs == nil {
		t.Fatalf("no packs, decoded: %v", err)
	}
}

func TestPackedManifestRefusesBadOnes(t *testing.T) {
	b, _, err := packed().Encode()
	if err != nil {
		t.Fatal(err)
	}
	m := packed()
	other := m.Packs[1].ID.String()
	for name, change := range map[string]func(s string) string{
		// A pack whose name is not its chunk list's hash.
		"misnamed": func(s string) string { return strings.Replace(s, other, strings.Repeat("0", 64), 1) },
		// Packs in a manifest of version 1 or 2.
		"version 1": func(s string) string { return strings.Replace(s, `"version":3`, `"version":1`, 1) },
		"version 2": func(s string) string { return strings.Replace(s, `"version":3`, `"version":2`, 1) },
		// A later version: refused, not misread.
		"version 4": func(s string) string { return strings.Replace(s, `"version":3`, `"version":4`, 1) },
	} {
		bad := []byte(change(string(b)))
		if bytes.Equal(bad, b) {
			t.Fatalf("%s: changed nothing", name)
		}
		if _, err := Decode(bad, Sum(bad)); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	// A chunk in two packs, or an empty pack, is never encoded.
	dup := packed()
	dup.Packs = append(dup.Packs, dup.Packs[0])
	if b, root, err := dup.Encode(); err == nil {
		if _, err := Decode(b, root); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("a chunk in two packs: %v", err)
		}
	}
	empty := packed()
	empty.Packs = append(empty.Packs, Pack{ID: newPack(nil).ID})
	if _, _, err := empty.Encode(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("an empty pack: %v", err)
	}
	wrong := packed()
	wrong.Packs[0].ID[0] ^= 1
	if _, _, err := wrong.Encode(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a misnamed pack: %v", err)
	}
}

// A manifest over a packed base locates the chunks it copies from the
// base in the base's packs, and its own in its own.
func TestPackedManifestOverBase(t *testing.T) {
	base := packed()
	bb, baseRoot, err := base.Encode()
	if err != nil {
		t.Fatal(err)
	}
	base, err = Decode(bb, baseRoot)
	if err != nil {
		t.Fatal(err)
	}
	d := derived()
	d.Packs = []Pack{newPack([]Chunk{{Size: 10, Hash: Sum([]byte("9876543210"))}, {Size: 50000, Hash: Sum([]byte("c"))}})}
	b, root, err := d.EncodeOver(base, baseRoot)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b, root)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.resolve(base); err != nil {
		t.Fatal(err)
	}
	if p, _, ok := got.Locate(Sum([]byte("a"))); !ok || p != base.Packs[0].ID {
		t.Fatalf("a chunk of the base: in %s (%v)", p, ok)
	}
	if p, off, ok := got.Locate(Sum([]byte("c"))); !ok || p != d.Packs[0].ID || off != 10 {
		t.Fatalf("a chunk of its own: in %s+%d (%v)", p, off, ok)
	}
	if _, _, ok := got.Locate(Sum([]byte("b"))); ok {
		t.Fatal("a chunk of the base it does not use is located")
	}
	// A version 2 manifest over the packed base reads the base's packs too.
	d.Packs = nil
	b, root, _ = d.EncodeOver(base, baseRoot)
	if !bytes.HasPrefix(b, []byte(`{"version":2,`)) {
		t.Fatalf("no packs over a base: %s", b[:20])
	}
	got, _ = Decode(b, root)
	if err := got.resolve(base); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := got.Locate(Sum([]byte("a"))); !ok {
		t.Fatal("a version 2 manifest over a packed base does not locate its chunks")
	}
}

func TestSpans(t *testing.T) {
	var chunks []Chunk
	var hs []Hash
	for i := range 200 {
		h := Sum([]byte{byte(i), byte(i >> 8)})
		chunks = append(chunks, Chunk{Size: 40 << 10, Hash: h})
		hs = append(hs, h)
	}
	p := newPack(chunks)
	m := &Manifest{locs: map[Hash]loc{}}
	for i, h := range hs {
		m.locs[h] = loc{p.ID, int64(i) * 40 << 10}
	}
	size := func(Hash) int { return 40 << 10 }
	// All 200 (8,000 KiB): two ranged reads of at most 4 MiB.
	if sp := spans(m, hs, size); len(sp) != 2 || sp[0].n != 102*40<<10 || sp[1].off != int64(sp[0].n) {
		t.Fatalf("spans of the whole pack: %d", len(sp))
	}
	// Every other one: gaps of 40 KiB are read through; every fourth
	// (gaps of 120 KiB) are not.
	var odd, fourth []Hash
	for i, h := range hs {
		if i%2 == 1 {
			odd = append(odd, h)
		}
		if i%4 == 0 {
			fourth = append(fourth, h)
		}
	}
	if sp := spans(m, odd, size); len(sp) != 2 {
		t.Fatalf("every other chunk: %d spans", len(sp))
	}
	if sp := spans(m, fourth, size); len(sp) != 50 {
		t.Fatalf("every fourth chunk: %d spans, want one each", len(sp))
	}
}

// An import whose fetched chunks are more than it keeps in memory
// assembles from the cache (held behind, or written): the same bytes,
// and every chunk cached once the cache's writers are done.
func TestImportPackedThroughTheCache(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	if err := os.Mkdir(img, 0o700); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 3<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	if err := os.WriteFile(filepath.Join(img, "pages.img"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := OpenFile(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := New(b, Options{PackBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Export(ctx, img, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func(old int64) { memBytes = old }(memBytes)
	for _, limit := range []int64{0, 256 << 20} {
		memBytes = limit
		cache, err := OpenCache(filepath.Join(dir, fmt.Sprintf("cache-%d", limit)), 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		cold, err := New(b, Options{PackBytes: 1 << 20, Cache: cache})
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, fmt.Sprintf("out-%d", limit))
		ist, err := cold.Import(ctx, st.Root, out)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(filepath.Join(out, "pages.img"))
		cache.Flush()
		if !bytes.Equal(got, data) || ist.Transferred != st.Distinct || cache.Stats().Objects < st.Distinct {
			t.Fatalf("memory limit %d: import %s, %d objects cached", limit, &ist, cache.Stats().Objects)
		}
	}
}

// countingBackend counts the reads of chunks and packs.
type countingBackend struct {
	Backend
	reads atomic.Int64
}

func (c *countingBackend) Get(ctx context.Context, key string) ([]byte, error) {
	if !strings.HasPrefix(key, "manifests/") {
		c.reads.Add(1)
	}
	return c.Backend.Get(ctx, key)
}

func (c *countingBackend) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	c.reads.Add(1)
	return getRange(ctx, c.Backend, key, off, n)
}

// An import returns without waiting for the cache's writes: the chunks
// it fetched are held, read from memory by the next import, and written
// after; a crash before they are written (the cache opened again) loses
// only those copies, and nothing half-written is ever an object.
func TestImportWritesTheCacheBehind(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	if err := os.Mkdir(img, 0o700); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 3<<20)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	if err := os.WriteFile(filepath.Join(img, "pages.img"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	fb, err := OpenFile(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := New(fb, Options{PackBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Export(ctx, img, nil)
	if err != nil {
		t.Fatal(err)
	}

	// The cache's writers wait until released.
	release := make(chan struct{})
	var waiting atomic.Int64
	behindHold = func(string) { waiting.Add(1); <-release }
	released := false
	cacheDir := filepath.Join(dir, "cache")
	cache, err := OpenCache(cacheDir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !released {
			close(release)
		}
		cache.Flush()
		behindHold = nil
	})
	b := &countingBackend{Backend: fb}
	host, err := New(b, Options{PackBytes: 1 << 20, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(dir, name, "pages.img"))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: not the image (%v)", name, err)
		}
	}
	chunkFiles := func() int {
		n := 0
		filepath.WalkDir(filepath.Join(cacheDir, "chunks"), func(_ string, e os.DirEntry, _ error) error {
			if e != nil && !e.IsDir() {
				n++
			}
			return nil
		})
		return n
	}
	ist, err := host.Import(ctx, st.Root, filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	check("out")
	cs := cache.Stats()
	if ist.Transferred != st.Distinct || cs.Behind != st.Distinct || cs.Objects != 1 || chunkFiles() != 0 || waiting.Load() == 0 {
		t.Fatalf("import with the cache's writes held: %s; cache %+v, %d chunk files, %d writers waiting", &ist, cs, chunkFiles(), waiting.Load())
	}
	// The next import reads them from memory, not the store.
	reads := b.reads.Load()
	again, err := host.Import(ctx, st.Root, filepath.Join(dir, "again"))
	if err != nil {
		t.Fatal(err)
	}
	check("again")
	if again.Transferred != 0 || b.reads.Load() != reads {
		t.Fatalf("import of chunks held behind: %s, %d reads of the store", &again, b.reads.Load()-reads)
	}
	// A crash now: the cache opened again has only what was written.
	reopened, err := OpenCache(cacheDir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if rs := reopened.Stats(); rs.Objects != 1 || rs.Behind != 0 {
		t.Fatalf("the cache after a crash before its writes: %+v", rs)
	}
	// Released, every chunk is written, whole, under its hash.
	close(release)
	released = true
	cache.Flush()
	if cs := cache.Stats(); cs.Behind != 0 || cs.BehindBytes != 0 || cs.Objects != st.Distinct+1 || chunkFiles() != st.Distinct {
		t.Fatalf("after the writes: %+v, %d chunk files", cs, chunkFiles())
	}
	m, err := host.Manifest(ctx, st.Root)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range m.Hashes() {
		b, err := os.ReadFile(filepath.Join(cacheDir, filepath.FromSlash(ChunkKey(h))))
		if err != nil || Sum(b) != h {
			t.Fatalf("chunk %s in the cache: %v", h, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(cacheDir, "tmp")); len(ents) != 0 {
		t.Fatalf("temporary files left: %v", ents)
	}
}
