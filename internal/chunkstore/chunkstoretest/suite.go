package chunkstoretest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/errdefs"
)

// Run runs the conformance suite: the Backend contract, then the Store over
// it (export and import byte-exact, deduplication, corruption detected in
// the store and in the cache, garbage collection, its lock). newBackend
// returns a fresh, empty store each call.
func Run(t *testing.T, newBackend func(t *testing.T) chunkstore.Backend) {
	t.Run("Objects", func(t *testing.T) { testObjects(t, newBackend(t)) })
	t.Run("Locks", func(t *testing.T) { testLocks(t, newBackend(t)) })
	// The Store over it, every chunk an object of its own (manifests of
	// version 1 and 2), then with pack files (version 3; small packs, so
	// that an image is several packs and an import several ranges).
	for _, cs := range []suite{{"Loose", -1}, {"Packed", 96 << 10}} {
		t.Run(cs.name, func(t *testing.T) {
			t.Run("RoundTrip", func(t *testing.T) { cs.testRoundTrip(t, newBackend(t)) })
			t.Run("Dedup", func(t *testing.T) { cs.testDedup(t, newBackend(t)) })
			t.Run("CorruptInStore", func(t *testing.T) { cs.testCorruptInStore(t, newBackend(t)) })
			t.Run("CorruptInCache", func(t *testing.T) { cs.testCorruptInCache(t, newBackend(t)) })
			t.Run("Cancelled", func(t *testing.T) { cs.testCancelled(t, newBackend(t)) })
			t.Run("LinkFiles", func(t *testing.T) { cs.testLinkFiles(t, newBackend(t)) })
			t.Run("GC", func(t *testing.T) { cs.testGC(t, newBackend(t)) })
			t.Run("GCAgainstExport", func(t *testing.T) { cs.testGCAgainstExport(t, newBackend(t)) })
			t.Run("GCWaitingForTheLock", func(t *testing.T) { cs.testGCWaitingForTheLock(t, newBackend(t)) })
			t.Run("GCAgainstRewrite", func(t *testing.T) { cs.testGCAgainstRewrite(t, newBackend(t)) })
			t.Run("Base", func(t *testing.T) { cs.testBase(t, newBackend(t)) })
			t.Run("BaseChain", func(t *testing.T) { cs.testBaseChain(t, newBackend(t)) })
			t.Run("GCAgainstExportOverBase", func(t *testing.T) { cs.testGCAgainstExportOverBase(t, newBackend(t)) })
		})
	}
	t.Run("Packs", func(t *testing.T) { testPacks(t, newBackend(t)) })
	t.Run("CorruptPack", func(t *testing.T) { testCorruptPack(t, newBackend(t)) })
	t.Run("GCPacks", func(t *testing.T) { testGCPacks(t, newBackend(t)) })
	t.Run("PacksOverLoose", func(t *testing.T) { testPacksOverLoose(t, newBackend(t)) })
}

// suite is how the Store tests run: with pack files (pack bytes > 0) or
// without.
type suite struct {
	name string
	pack int
}

func (cs suite) packed() bool { return cs.pack > 0 }

// store is NewStore with the suite's packs.
func (cs suite) store(t testing.TB, b chunkstore.Backend, cached bool) (*chunkstore.Store, *chunkstore.Cache) {
	return NewStoreWith(t, b, cached, chunkstore.Options{PackBytes: cs.pack})
}

// Small images: a few hundred KiB each, so the suite stays quick.
var (
	imgA  = Image{Seed: 1, Pool: 7, Pages: 300, ZeroRun: 200}
	imgA2 = Image{Seed: 2, Pool: 7, Pages: 310} // shares pages with imgA
	imgB  = Image{Seed: 3, Pool: 9, Pages: 200} // shares nothing
)

// NewStore returns a Store over b with a cache in a temporary directory.
func NewStore(t testing.TB, b chunkstore.Backend, cached bool) (*chunkstore.Store, *chunkstore.Cache) {
	return NewStoreWith(t, b, cached, chunkstore.Options{})
}

// NewStoreWith is NewStore with opts (its Cache and Retry set here).
func NewStoreWith(t testing.TB, b chunkstore.Backend, cached bool, opts chunkstore.Options) (*chunkstore.Store, *chunkstore.Cache) {
	t.Helper()
	var c *chunkstore.Cache
	if cached {
		var err error
		if c, err = chunkstore.OpenCache(t.TempDir(), 1<<30); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Flush) // its writes behind imports, before its directory goes
	}
	opts.Cache, opts.Retry = c, chunkstore.Retry{Attempts: 2, Base: 10 * time.Millisecond}
	s, err := chunkstore.New(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func testObjects(t *testing.T, b chunkstore.Backend) {
	c := ctx(t)
	if _, err := b.Get(c, "chunks/00/absent"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get of an absent object: %v, want ErrNotFound", err)
	}
	if err := b.Delete(c, "chunks/00/absent"); err != nil {
		t.Fatalf("delete of an absent object: %v", err)
	}
	objs := map[string][]byte{
		"chunks/ab/one":  []byte("one"),
		"chunks/cd/two":  bytes.Repeat([]byte{2}, 100<<10),
		"manifests/root": []byte("{}"),
		"chunks/ab/zero": {},
	}
	for k, v := range objs {
		if err := b.Put(c, k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Put(c, "chunks/ab/one", []byte("one, again")); err != nil {
		t.Fatal(err)
	}
	objs["chunks/ab/one"] = []byte("one, again")
	for k, v := range objs {
		got, err := b.Get(c, k)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %s: %d bytes, %v; want %d bytes", k, len(got), err, len(v))
		}
	}
	found, err := b.Has(c, []string{"chunks/ab/one", "chunks/ab/nope", "manifests/root", "manifests/nope"})
	if err != nil || !slices.Equal(found, []bool{true, false, true, false}) {
		t.Fatalf("has: %v, %v", found, err)
	}
	if err := b.Flush(c); err != nil {
		t.Fatal(err)
	}
	list := func(prefix string) map[string]int64 {
		got := map[string]int64{}
		err := b.List(c, prefix, func(o chunkstore.Object) error {
			if o.Modified.IsZero() || time.Since(o.Modified) > time.Hour {
				t.Errorf("%s: modified %v", o.Key, o.Modified)
			}
			got[o.Key] = o.Size
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := list("chunks/"); len(got) != 3 || got["chunks/cd/two"] != 100<<10 || got["chunks/ab/zero"] != 0 {
		t.Fatalf("list chunks/: %v", got)
	}
	if got := list("chunks/ab/"); len(got) != 2 {
		t.Fatalf("list chunks/ab/: %v", got)
	}
	if got := list("manifests/"); len(got) != 1 {
		t.Fatalf("list manifests/: %v", got)
	}
	if got := list("nothing/"); len(got) != 0 {
		t.Fatalf("list nothing/: %v", got)
	}
	stop := errors.New("stop")
	if err := b.List(c, "chunks/", func(chunkstore.Object) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("list stops at fn's error: %v", err)
	}
	if err := b.Delete(c, "chunks/ab/one"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(c, "chunks/ab/one"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if b.String() == "" {
		t.Fatal("no name")
	}
}

func testLocks(t *testing.T, b chunkstore.Backend) {
	c := ctx(t)
	short := func() context.Context {
		s, cancel := context.WithTimeout(c, 300*time.Millisecond)
		t.Cleanup(cancel)
		return s
	}
	_, un1, err := b.Lock(c, chunkstore.LockStore, false)
	if err != nil {
		t.Fatal(err)
	}
	_, un2, err := b.Lock(short(), chunkstore.LockStore, false)
	if err != nil {
		t.Fatalf("two shared holders: %v", err)
	}
	if _, _, err := b.Lock(short(), chunkstore.LockStore, true); err == nil {
		t.Fatal("exclusive lock taken while shared ones are held")
	}
	// Another name is another lock.
	_, unGC, err := b.Lock(short(), chunkstore.LockGC, true)
	if err != nil {
		t.Fatalf("gc lock while the store lock is shared: %v", err)
	}
	if _, _, err := b.Lock(short(), chunkstore.LockGC, true); err == nil {
		t.Fatal("two exclusive holders")
	}
	unGC()
	un1()
	un2()
	held, unX, err := b.Lock(c, chunkstore.LockStore, true)
	if err != nil {
		t.Fatalf("exclusive after the shared ones left: %v", err)
	}
	if held.Err() != nil {
		t.Fatal("held context done while the lock is held")
	}
	if _, _, err := b.Lock(short(), chunkstore.LockStore, false); err == nil {
		t.Fatal("shared lock taken while an exclusive one is held")
	}
	// A waiter gets the lock once it is released.
	got := make(chan error, 1)
	go func() {
		_, un, err := b.Lock(c, chunkstore.LockStore, false)
		if err == nil {
			un()
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	unX()
	if held.Err() == nil {
		t.Fatal("held context not cancelled by unlock")
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never got the lock")
	}
}

func (cs suite) testRoundTrip(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	imgA.Write(t, src)
	meta := map[string]string{"template.artifact": "abc", "runsc": "v1"}
	for _, cached := range []bool{false, true} {
		s, _ := cs.store(t, b, cached)
		st, err := s.Export(ctx(t), src, meta)
		if err != nil {
			t.Fatal(err)
		}
		if st.Files != 4 || st.ZeroChunks == 0 || st.Distinct == 0 || st.Root.IsZero() {
			t.Fatalf("export stats: %s", &st)
		}
		m, err := s.Manifest(ctx(t), st.Root)
		if err != nil {
			t.Fatal(err)
		}
		if m.Meta["template.artifact"] != "abc" || len(m.Files) != 4 || m.Files[0].Name != "checkpoint.img" {
			t.Fatalf("manifest: %+v", m)
		}
		out := filepath.Join(dir, "out"+map[bool]string{true: "-cached", false: ""}[cached])
		ist, err := s.Import(ctx(t), st.Root, out)
		if err != nil {
			t.Fatal(err)
		}
		Equal(t, src, out)
		if ist.Bytes != st.Bytes || ist.Distinct != st.Distinct || ist.ZeroChunks != st.ZeroChunks {
			t.Fatalf("import %s, export %s", &ist, &st)
		}
		// Zero chunks are holes (up to a block lost at each end).
		pages := filepath.Join(out, "pages.img")
		info, _ := os.Stat(pages)
		var zeros int64
		for _, c := range m.Files[2].Chunks {
			if c.Zero {
				zeros += int64(c.Size)
			}
		}
		if a := Allocated(t, pages); zeros < 4*4096 || a > info.Size()-zeros+2*4096 {
			t.Fatalf("pages.img: %d bytes allocated of %d, %d in zero chunks, want those left as holes", a, info.Size(), zeros)
		}
		if cached {
			// A second import reads only the cache.
			ist, err := s.Import(ctx(t), st.Root, out+"-again")
			if err != nil {
				t.Fatal(err)
			}
			if ist.Transferred != 0 || ist.Present != ist.Distinct {
				t.Fatalf("import from a warm cache fetched: %s", &ist)
			}
			Equal(t, src, out+"-again")
		}
		if _, err := s.Import(ctx(t), st.Root, out); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("import over an existing directory: %v", err)
		}
	}
	s, _ := cs.store(t, b, false)
	var absent chunkstore.Hash
	absent[0] = 1
	if _, err := s.Import(ctx(t), absent, filepath.Join(dir, "absent")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("import of an absent manifest: %v", err)
	}
	if _, err := s.Export(ctx(t), filepath.Join(dir, "nope"), nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("export of a missing directory: %v", err)
	}
	noLeftovers(t, dir, "src", "out", "out-cached", "out-cached-again")
}

// noLeftovers fails unless dir holds exactly the names given.
func noLeftovers(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	slices.Sort(names)
	if !slices.Equal(got, names) {
		t.Fatalf("%s holds %v, want %v", dir, got, names)
	}
}

func (cs suite) testDedup(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	s, _ := cs.store(t, b, true)
	imgA.Write(t, filepath.Join(dir, "a"))
	imgA2.Write(t, filepath.Join(dir, "a2"))
	first, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if first.Present != 0 || first.Transferred != first.Distinct {
		t.Fatalf("first export into an empty store: %s", &first)
	}
	again, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Root != first.Root || again.Transferred != 0 || again.Present != first.Distinct {
		t.Fatalf("second export of the same image: %s (first %s)", &again, &first)
	}
	if again.Asked != 0 {
		t.Fatalf("the second export asked the store about %d chunks it had just uploaded", again.Asked)
	}
	// With packs, an image shares stored chunks through its base (a
	// packed chunk is not an object the existence check finds).
	var over chunkstore.Hash
	if cs.packed() {
		over = first.Root
	}
	other, err := s.ExportOver(ctx(t), filepath.Join(dir, "a2"), nil, over)
	if err != nil {
		t.Fatal(err)
	}
	if other.Root == first.Root || other.Present == 0 {
		t.Fatalf("an image sharing pages shares no chunks: %s", &other)
	}
	// The same bytes with other metadata: another manifest, no chunk.
	meta, err := s.Export(ctx(t), filepath.Join(dir, "a"), map[string]string{"k": "v"})
	if err != nil || meta.Root == first.Root || meta.Transferred != 0 {
		t.Fatalf("export with metadata: %s, %v", &meta, err)
	}
	// Concurrent exports of one image agree.
	var wg sync.WaitGroup
	roots := make([]chunkstore.Hash, 3)
	for i := range roots {
		wg.Go(func() {
			st, err := s.ExportOver(ctx(t), filepath.Join(dir, "a2"), nil, over)
			if err != nil {
				t.Error(err)
			}
			roots[i] = st.Root
		})
	}
	wg.Wait()
	for _, r := range roots {
		if r != other.Root {
			t.Fatalf("concurrent exports: roots %v, want %s", roots, other.Root)
		}
	}
}

func (cs suite) testCorruptInStore(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	s, _ := cs.store(t, b, true)
	imgA.Write(t, filepath.Join(dir, "a"))
	st, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Manifest(ctx(t), st.Root)
	if err != nil {
		t.Fatal(err)
	}
	victim := m.Files[2].Chunks[1] // pages.img
	key, off := StoredAt(m, victim.Hash)
	good, err := b.Get(ctx(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if cs.packed() != (key != chunkstore.ChunkKey(victim.Hash)) {
		t.Fatalf("chunk stored at %s (packs %v)", key, cs.packed())
	}
	bad := slices.Clone(good)
	bad[off+int64(victim.Size)/2] ^= 1
	if err := b.Put(ctx(t), key, bad); err != nil {
		t.Fatal(err)
	}
	// Imported through a host cache, and without one (read straight into
	// the image where the store holds chunks loose).
	cold, _ := cs.store(t, b, true)
	uncached, _ := cs.store(t, b, false)
	for _, s := range []*chunkstore.Store{cold, uncached} {
		if _, err := s.Import(ctx(t), st.Root, filepath.Join(dir, "out")); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("import with a corrupt chunk in the store: %v, want ErrCorrupt", err)
		}
	}
	// A corrupt chunk that is also shorter (a pack cut short in it).
	if err := b.Put(ctx(t), key, good[:off+10]); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*chunkstore.Store{cold, uncached} {
		if _, err := s.Import(ctx(t), st.Root, filepath.Join(dir, "out")); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("import with a truncated chunk in the store: %v, want ErrCorrupt", err)
		}
	}
	// A corrupt manifest.
	body, err := b.Get(ctx(t), chunkstore.ManifestKey(st.Root))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Put(ctx(t), chunkstore.ManifestKey(st.Root), flipped(body)); err != nil {
		t.Fatal(err)
	}
	if _, err := uncached.Manifest(ctx(t), st.Root); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("corrupt manifest: %v, want ErrCorrupt", err)
	}
	noLeftovers(t, dir, "a")
	// Exporting again repairs nothing in place (the chunk is "present"),
	// but a store whose chunk is put back serves the image again.
	if err := b.Put(ctx(t), key, good); err != nil {
		t.Fatal(err)
	}
	if err := b.Put(ctx(t), chunkstore.ManifestKey(st.Root), body); err != nil {
		t.Fatal(err)
	}
	if _, err := cold.Import(ctx(t), st.Root, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "out"))
}

func (cs suite) testCorruptInCache(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	s, cache := cs.store(t, b, true)
	imgA.Write(t, filepath.Join(dir, "a"))
	st, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Manifest(ctx(t), st.Root)
	if err != nil {
		t.Fatal(err)
	}
	// Flip a byte of a cached chunk, and truncate another.
	hashes := m.Hashes()
	for i, h := range hashes[:2] {
		p := filepath.Join(cache.Dir(), filepath.FromSlash(chunkstore.ChunkKey(h)))
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("export did not fill the cache: %v", err)
		}
		if i == 0 {
			data[0] ^= 0xff
		} else {
			data = data[:len(data)-1]
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ist, err := s.Import(ctx(t), st.Root, filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "out"))
	if ist.CacheCorrupt != 2 || ist.Transferred != 2 {
		t.Fatalf("import over a corrupt cache: %s, %d corrupt in the cache; want 2 refetched", &ist, ist.CacheCorrupt)
	}
	// Corrupt in both: detected, never written.
	p := filepath.Join(cache.Dir(), filepath.FromSlash(chunkstore.ChunkKey(hashes[3])))
	data, _ := os.ReadFile(p)
	data[5] ^= 1
	os.WriteFile(p, data, 0o600)
	PutStored(t, b, m, hashes[3], data)
	if _, err := s.Import(ctx(t), st.Root, filepath.Join(dir, "out2")); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("corrupt in the cache and the store: %v", err)
	}
	noLeftovers(t, dir, "a", "out")
}

func (cs suite) testCancelled(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	s, _ := cs.store(t, b, false)
	imgA.Write(t, filepath.Join(dir, "a"))
	c, cancel := context.WithCancel(ctx(t))
	cancel()
	if _, err := s.Export(c, filepath.Join(dir, "a"), nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled export: %v", err)
	}
	n := 0
	b.List(ctx(t), "manifests/", func(chunkstore.Object) error { n++; return nil })
	if n != 0 {
		t.Fatalf("a cancelled export wrote %d manifests", n)
	}
	st, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(c, st.Root, filepath.Join(dir, "out")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled import: %v", err)
	}
	noLeftovers(t, dir, "a")
}

// stored counts the chunk and pack objects in the store, and their bytes.
func stored(t *testing.T, b chunkstore.Backend) (n int, bytes int64) {
	t.Helper()
	n, bytes = count(t, b, "chunks/")
	np, bp := count(t, b, "packs/")
	return n + np, bytes + bp
}

// deleted is how many chunk and pack objects a collection deleted.
func deleted(st chunkstore.GCStats) int { return st.DeletedChunks + st.DeletedPacks }

func count(t *testing.T, b chunkstore.Backend, prefix string) (n int, bytes int64) {
	t.Helper()
	if err := b.List(ctx(t), prefix, func(o chunkstore.Object) error { n++; bytes += o.Size; return nil }); err != nil {
		t.Fatal(err)
	}
	return n, bytes
}

func (cs suite) testGC(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	s, _ := cs.store(t, b, false)
	imgA.Write(t, filepath.Join(dir, "a"))
	imgA2.Write(t, filepath.Join(dir, "a2"))
	imgB.Write(t, filepath.Join(dir, "b"))
	var roots []chunkstore.Hash
	for _, n := range []string{"a", "a2", "b"} {
		st, err := s.Export(ctx(t), filepath.Join(dir, n), nil)
		if err != nil {
			t.Fatal(err)
		}
		roots = append(roots, st.Root)
	}
	chunks, chunkBytes := stored(t, b)
	live := chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return roots[:2], nil })
	// Within the grace period nothing goes.
	st, err := s.GC(ctx(t), live, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if deleted(st) != 0 || st.DeletedManifests != 0 || st.Chunks+st.Packs != chunks || st.Manifests != 3 {
		t.Fatalf("gc within the grace period: %+v", st)
	}
	// A root the caller holds that the store does not is reported.
	var ghost chunkstore.Hash
	ghost[0] = 7
	withGhost := chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return append(roots[:2:2], ghost), nil })
	st, err = s.GC(ctx(t), withGhost, 0)
	if err != nil {
		t.Fatal(err)
	}
	left, leftBytes := stored(t, b)
	if st.DeletedManifests != 1 || deleted(st) == 0 || deleted(st) != chunks-left || st.MissingLive != 1 {
		t.Fatalf("gc: %+v; %d chunks before, %d after", st, chunks, left)
	}
	if st.BytesFreed < chunkBytes-leftBytes {
		t.Fatalf("gc freed %d bytes, the chunks alone were %d", st.BytesFreed, chunkBytes-leftBytes)
	}
	if found, _ := s.HasManifest(ctx(t), roots[2]); found {
		t.Fatal("the dead manifest is still there")
	}
	for i, n := range []string{"a", "a2"} {
		out := filepath.Join(dir, "out-"+n)
		if _, err := s.Import(ctx(t), roots[i], out); err != nil {
			t.Fatalf("live image %s after gc: %v", n, err)
		}
		Equal(t, filepath.Join(dir, n), out)
	}
	// Everything dead: the store is empty again.
	st, err = s.GC(ctx(t), chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return nil, nil }), 0)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := stored(t, b); n != 0 {
		t.Fatalf("%d chunks or packs left with no live manifest (%+v)", n, st)
	}
	if n, _ := count(t, b, "manifests/"); n != 0 {
		t.Fatalf("%d manifests left with none live", n)
	}
	// The store knew those chunks were there: after a collection it must
	// not trust that.
	again, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Transferred != again.Distinct {
		t.Fatalf("export after a collection emptied the store: %s", &again)
	}
	if _, err := s.Import(ctx(t), again.Root, filepath.Join(dir, "out-again")); err != nil {
		t.Fatal(err)
	}
}

// hooked calls onList before listing prefix, once.
type hooked struct {
	chunkstore.Backend
	prefix string
	once   sync.Once
	onList func()
}

func (h *hooked) List(ctx context.Context, prefix string, fn func(chunkstore.Object) error) error {
	if strings.HasPrefix(prefix, h.prefix) {
		h.once.Do(h.onList)
	}
	return h.Backend.List(ctx, prefix, fn)
}

// testGCAgainstExport runs an export that finds every chunk already stored
// (chunks no manifest names any more, older than the grace period: a
// collection's candidates) between the collection's mark and its sweep.
// The collection must see the export's manifest and keep them.
func (cs suite) testGCAgainstExport(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	imgA.Write(t, filepath.Join(dir, "a"))
	plain, _ := cs.store(t, b, false)
	first, err := plain.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.DeleteManifest(ctx(t), first.Root); err != nil {
		t.Fatal(err)
	}
	var again chunkstore.Stats
	var exported atomic.Bool
	h := &hooked{Backend: b, prefix: "chunks/", onList: func() {
		var err error
		again, err = plain.Export(ctx(t), filepath.Join(dir, "a"), nil)
		if err != nil {
			t.Error(err)
		}
		exported.Store(true)
	}}
	s, _ := cs.store(t, h, false)
	// The export's manifest is not live for the caller yet (it records the
	// root after Export returns): only the lock protects its chunks.
	none := chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return nil, nil })
	st, err := s.GC(ctx(t), none, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !exported.Load() || again.Transferred != 0 {
		t.Fatalf("the export did not run between mark and sweep, or uploaded: %s", &again)
	}
	if deleted(st) != 0 || st.LiveManifests != 1 {
		t.Fatalf("gc against an export: %+v", st)
	}
	if _, err := plain.Import(ctx(t), again.Root, filepath.Join(dir, "out")); err != nil {
		t.Fatalf("the export's image after gc: %v", err)
	}
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "out"))
}

// testGCWaitingForTheLock: a collection whose caller read its live roots
// and then waited for another collector's lock longer than the grace
// period keeps a manifest written while it waited (its caller could not
// have named it): the grace counts from the call.
func (cs suite) testGCWaitingForTheLock(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	imgA.Write(t, filepath.Join(dir, "a"))
	s, _ := cs.store(t, b, false)
	_, unGC, err := b.(chunkstore.Locker).Lock(ctx(t), chunkstore.LockGC, true)
	if err != nil {
		t.Fatal(err)
	}
	none := chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return nil, nil })
	const grace = 1500 * time.Millisecond // above S3's one-second times
	done := make(chan error, 1)
	var st chunkstore.GCStats
	go func() {
		var err error
		st, err = s.GC(ctx(t), none, grace) // its live roots are read now: none
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	written, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * grace) // the manifest is older than the grace when the lock comes
	unGC()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st.DeletedManifests != 0 {
		t.Fatalf("a collection that waited for the lock deleted a manifest written meanwhile: %+v", st)
	}
	if _, err := s.Import(ctx(t), written.Root, filepath.Join(dir, "out")); err != nil {
		t.Fatalf("the manifest written while the collection waited: %v", err)
	}
}

// testGCAgainstExportOverBase runs an export over a base that no live
// manifest names (a collection's candidate, with its chunks) between the
// collection's mark and its sweep: the collection must keep the base and
// its chunks for the export's manifest.
func (cs suite) testGCAgainstExportOverBase(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	imgA.Write(t, filepath.Join(dir, "a"))
	derive(t, filepath.Join(dir, "a"), filepath.Join(dir, "d"), 0x11, 4096*30)
	plain, _ := cs.store(t, b, false)
	base, err := plain.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var over chunkstore.Stats
	h := &hooked{Backend: b, prefix: "chunks/", onList: func() {
		var err error
		if over, err = plain.ExportOver(ctx(t), filepath.Join(dir, "d"), nil, base.Root); err != nil {
			t.Error(err)
		}
	}}
	s, _ := cs.store(t, h, false)
	none := chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return nil, nil })
	st, err := s.GC(ctx(t), none, 0)
	if err != nil {
		t.Fatal(err)
	}
	if over.Base != base.Root {
		t.Fatalf("the export between mark and sweep: %s, over %s", &over, over.Base)
	}
	if st.DeletedManifests != 0 || deleted(st) != 0 || st.LiveManifests != 2 {
		t.Fatalf("gc against an export over a base: %+v", st)
	}
	if _, err := plain.Import(ctx(t), over.Root, filepath.Join(dir, "out")); err != nil {
		t.Fatalf("the export's image after gc: %v", err)
	}
	Equal(t, filepath.Join(dir, "d"), filepath.Join(dir, "out"))
}

// testLinkFiles: with Options.LinkFiles, a second import of the same image
// hard-links its large files from the cache instead of writing them.
func (cs suite) testLinkFiles(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	cache, err := chunkstore.OpenCache(filepath.Join(dir, "cache"), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cache.Flush)
	s, err := chunkstore.New(b, chunkstore.Options{Cache: cache, LinkFiles: true, PackBytes: cs.pack})
	if err != nil {
		t.Fatal(err)
	}
	imgA.Write(t, filepath.Join(dir, "a"))
	st, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.Import(ctx(t), st.Root, filepath.Join(dir, "one"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Import(ctx(t), st.Root, filepath.Join(dir, "two"))
	if err != nil {
		t.Fatal(err)
	}
	if first.LinkedFiles != 0 || second.LinkedFiles != 1 {
		t.Fatalf("linked files: first import %d, second %d; want 0, then 1 (pages.img)", first.LinkedFiles, second.LinkedFiles)
	}
	equalBoth(t, dir)
	a, _ := os.Stat(filepath.Join(dir, "one", "pages.img"))
	c, _ := os.Stat(filepath.Join(dir, "two", "pages.img"))
	if !os.SameFile(a, c) {
		t.Fatal("the second import's pages.img is not a link to the first's")
	}
	// The first image going away leaves the second, and the cache's link.
	os.RemoveAll(filepath.Join(dir, "one"))
	third, err := s.Import(ctx(t), st.Root, filepath.Join(dir, "three"))
	if err != nil || third.LinkedFiles != 1 {
		t.Fatalf("third import: %v, %d linked", err, third.LinkedFiles)
	}
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "three"))
}

func equalBoth(t *testing.T, dir string) {
	t.Helper()
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "one"))
	Equal(t, filepath.Join(dir, "a"), filepath.Join(dir, "two"))
}

// derive copies the image src to dst with n bytes changed at each of the
// offsets of pages.img and one at the start of checkpoint.img: a sandbox
// restored from src that changed a little.
func derive(t *testing.T, src, dst string, seed byte, offsets ...int64) {
	t.Helper()
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		switch e.Name() {
		case "pages.img":
			for _, off := range offsets {
				for i := range int64(64) {
					b[off+i] ^= seed
				}
			}
		case "checkpoint.img":
			b[0] ^= seed
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// testBase checks manifests over a base: small, imported byte-exact (over a
// chain of bases too), kept by a collection as long as a manifest over them
// is, refused when the base is corrupt, written flat when the base is gone.
func (cs suite) testBase(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	s, _ := cs.store(t, b, true)
	imgA.Write(t, filepath.Join(dir, "a"))
	derive(t, filepath.Join(dir, "a"), filepath.Join(dir, "d"), 0x5a, 4096*10, 4096*200)
	derive(t, filepath.Join(dir, "d"), filepath.Join(dir, "d2"), 0xa5, 4096*50)
	base, err := s.Export(ctx(t), filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if base.Base != (chunkstore.Hash{}) {
		t.Fatalf("a flat export has a base: %s", &base)
	}
	st, err := s.ExportOver(ctx(t), filepath.Join(dir, "d"), map[string]string{"k": "v"}, base.Root)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Manifest(ctx(t), st.Root)
	if err != nil {
		t.Fatal(err)
	}
	flat, _, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	// (With packs, both list the packs of the chunks it added.)
	small := 3
	if cs.packed() {
		small = 2
	}
	if st.Base != base.Root || m.Base != base.Root || st.ManifestBytes*small > len(flat) {
		t.Fatalf("export over a base: %s, %d bytes (flat %d), manifest base %s", &st, st.ManifestBytes, len(flat), m.Base)
	}
	// It asked the store only about chunks the base lacks, and uploaded
	// only those.
	if cs.packed() && (st.Asked != 0 || st.Transferred == 0 || st.Transferred >= st.Distinct/2 || st.Packs == 0) {
		t.Fatalf("packed export over a base asked about %d and uploaded %d of %d chunks in %d packs", st.Asked, st.Transferred, st.Distinct, st.Packs)
	}
	if !cs.packed() && (st.Asked >= st.Distinct/2 || st.Transferred == 0 || st.Transferred > st.Asked) {
		t.Fatalf("export over a base asked about %d and uploaded %d of %d chunks", st.Asked, st.Transferred, st.Distinct)
	}
	st2, err := s.ExportOver(ctx(t), filepath.Join(dir, "d2"), nil, st.Root)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Base != st.Root {
		t.Fatalf("export over d: %s", &st2)
	}
	cold, _ := cs.store(t, b, false)
	for n, r := range map[string]chunkstore.Hash{"d": st.Root, "d2": st2.Root} {
		out := filepath.Join(dir, "out-"+n)
		if _, err := cold.Import(ctx(t), r, out); err != nil {
			t.Fatal(err)
		}
		Equal(t, filepath.Join(dir, n), out)
		os.RemoveAll(out)
	}

	// A collection that keeps only d2 keeps d and a, its bases, and their
	// chunks.
	only := func(roots ...chunkstore.Hash) chunkstore.Roots {
		return chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return roots, nil })
	}
	gst, err := s.GC(ctx(t), only(st2.Root), 0)
	if err != nil {
		t.Fatal(err)
	}
	if gst.DeletedManifests != 0 || gst.LiveManifests != 3 {
		t.Fatalf("gc keeping d2: %+v", gst)
	}
	for n, r := range map[string]chunkstore.Hash{"a": base.Root, "d": st.Root, "d2": st2.Root} {
		out := filepath.Join(dir, "gc-"+n)
		if _, err := cold.Import(ctx(t), r, out); err != nil {
			t.Fatalf("%s after a gc that kept d2: %v", n, err)
		}
		Equal(t, filepath.Join(dir, n), out)
		os.RemoveAll(out)
	}

	// A corrupt base: the manifest over it is not imported.
	good, err := b.Get(ctx(t), chunkstore.ManifestKey(base.Root))
	if err != nil {
		t.Fatal(err)
	}
	bad := flipped(good)
	if err := b.Put(ctx(t), chunkstore.ManifestKey(base.Root), bad); err != nil {
		t.Fatal(err)
	}
	if _, err := cold.Import(ctx(t), st2.Root, filepath.Join(dir, "bad")); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("import over a corrupt base: %v, want ErrCorrupt", err)
	}
	// A base that is gone: not found, and an export over it is flat.
	if err := b.Delete(ctx(t), chunkstore.ManifestKey(base.Root)); err != nil {
		t.Fatal(err)
	}
	if _, err := cold.Import(ctx(t), st.Root, filepath.Join(dir, "bad")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("import over a missing base: %v, want ErrNotFound", err)
	}
	noLeftovers(t, dir, "a", "d", "d2")
	flatSt, err := cold.ExportOver(ctx(t), filepath.Join(dir, "d"), nil, base.Root)
	if err != nil {
		t.Fatal(err)
	}
	if flatSt.Base != (chunkstore.Hash{}) {
		t.Fatalf("export over a missing base: %s", &flatSt)
	}
	if _, err := cold.Import(ctx(t), flatSt.Root, filepath.Join(dir, "flat")); err != nil {
		t.Fatal(err)
	}
	Equal(t, filepath.Join(dir, "d"), filepath.Join(dir, "flat"))
	if err := b.Put(ctx(t), chunkstore.ManifestKey(base.Root), good); err != nil {
		t.Fatal(err)
	}

	// Nothing live: bases go with the rest.
	if _, err := s.GC(ctx(t), only(), 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := count(t, b, "manifests/"); n != 0 {
		t.Fatalf("%d manifests left with none live", n)
	}
	if n, _ := stored(t, b); n != 0 {
		t.Fatalf("%d chunks or packs left with none live", n)
	}
}

// testBaseChain exports a chain of images, each over the one before: past
// the depth limit an export is written flat, and every one imports.
func (cs suite) testBaseChain(t *testing.T, b chunkstore.Backend) {
	dir := t.TempDir()
	s, _ := cs.store(t, b, false)
	prev := filepath.Join(dir, "0")
	imgB.Write(t, prev)
	st, err := s.Export(ctx(t), prev, nil)
	if err != nil {
		t.Fatal(err)
	}
	roots := []chunkstore.Hash{st.Root}
	flat := 0
	for i := 1; i <= 10; i++ {
		cur := filepath.Join(dir, strconv.Itoa(i))
		derive(t, prev, cur, byte(i), int64(4096*i))
		st, err := s.ExportOver(ctx(t), cur, nil, roots[i-1])
		if err != nil {
			t.Fatal(err)
		}
		if st.Base == (chunkstore.Hash{}) {
			flat++
		}
		roots, prev = append(roots, st.Root), cur
	}
	// 0 flat, 1..7 over the one before, 8 flat (7 had 7 under it), 9 and
	// 10 over it.
	if flat != 1 {
		t.Fatalf("%d of 10 exports over the one before were flat, want 1 (at the depth limit)", flat)
	}
	for i, r := range roots {
		out := filepath.Join(dir, "out-"+strconv.Itoa(i))
		if _, err := s.Import(ctx(t), r, out); err != nil {
			t.Fatalf("image %d: %v", i, err)
		}
		Equal(t, filepath.Join(dir, strconv.Itoa(i)), out)
	}
}
