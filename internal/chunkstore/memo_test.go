package chunkstore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
)

// With Options.Immutable, a file with other names (a base-*.img, a hard
// link to a pages file images share) is cut once: later exports, of any
// image holding it, remember its chunks, and give the manifest a full read
// gives. A file written since is cut again.
func TestImmutableRemembersSharedFiles(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	b, err := chunkstore.OpenFile(filepath.Join(tmp, "store"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := chunkstore.New(b, chunkstore.Options{Immutable: true})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := chunkstore.New(b, chunkstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(tmp, "base")
	chunkstoretest.Image{Seed: 1, Pool: 1, Pages: 600, ZeroRun: 20}.Write(t, base)
	image := func(name string, seed uint64) string {
		dir := filepath.Join(tmp, name)
		chunkstoretest.Image{Seed: seed, Pool: 1, Pages: 300}.Write(t, dir)
		if err := os.Link(filepath.Join(base, "pages.img"), filepath.Join(dir, "base-1.img")); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	export := func(st *chunkstore.Store, dir string) chunkstore.Stats {
		t.Helper()
		out, err := st.Export(ctx, dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	a, c := image("a", 2), image("c", 3)
	if got := export(s, a); got.Reused != 0 {
		t.Fatalf("first export remembered %d files", got.Reused)
	}
	for _, dir := range []string{a, c} {
		got, want := export(s, dir), export(plain, dir)
		if got.Reused != 1 || got.Root != want.Root || got.Chunks != want.Chunks || got.ZeroChunks != want.ZeroChunks {
			t.Fatalf("%s: remembered export %s (%d remembered), full read %s", dir, &got, got.Reused, &want)
		}
	}
	// A store without the memo assembles the shared file.
	rootC := export(plain, c).Root
	assembled := filepath.Join(tmp, "c-assembled")
	if imp, err := plain.Import(ctx, rootC, assembled); err != nil || imp.LinkedFiles != 0 {
		t.Fatalf("plain import: %v, %d linked", err, imp.LinkedFiles)
	}
	chunkstoretest.Equal(t, c, assembled)
	// With it, an import links the shared file, under a name that still
	// holds it (c, its newest name, is gone: a deleted image).
	if err := os.RemoveAll(c); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "c-imported")
	imp, err := s.Import(ctx, rootC, out)
	if err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, assembled, out)
	if linked := sameFile(t, filepath.Join(out, "base-1.img"), filepath.Join(base, "pages.img")); imp.LinkedFiles != 1 || !linked {
		t.Errorf("import linked %d files; base-1.img is the shared file: %v", imp.LinkedFiles, linked)
	}
	// The shared file written since (another modification time): cut again.
	p := filepath.Join(base, "pages.img")
	data, _ := os.ReadFile(p)
	data[0] ^= 0xff
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Second)
	if err := os.Chtimes(p, later, later); err != nil {
		t.Fatal(err)
	}
	got, want := export(s, a), export(plain, a)
	if got.Reused != 0 || got.Root != want.Root {
		t.Fatalf("after a write: %s (%d remembered), full read %s", &got, got.Reused, &want)
	}
	// What it exported imports back byte for byte.
	out = filepath.Join(tmp, "a-imported")
	if _, err := s.Import(ctx, got.Root, out); err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, a, out)
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	ia, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := os.Stat(b)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(ia, ib)
}

// A host that never exported remembers a local image it has (a
// template's warm image): an import of an image holding the same file
// links it, and one holding a changed copy of it reads the chunks they
// share from the cache instead of the store.
func TestRememberLocalImage(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	b, err := chunkstore.OpenFile(filepath.Join(tmp, "store"))
	if err != nil {
		t.Fatal(err)
	}
	hostA, err := chunkstore.New(b, chunkstore.Options{Immutable: true})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := chunkstore.OpenCache(filepath.Join(tmp, "cache-b"), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cache.Flush)
	hostB, err := chunkstore.New(b, chunkstore.Options{Immutable: true, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	// The warm image, on host A and (its own copy) on host B.
	warmA, warmB := filepath.Join(tmp, "warm-a"), filepath.Join(tmp, "warm-b")
	chunkstoretest.Image{Seed: 1, Pool: 1, Pages: 600, ZeroRun: 20}.Write(t, warmA)
	chunkstoretest.Image{Seed: 1, Pool: 1, Pages: 600, ZeroRun: 20}.Write(t, warmB)
	// A snapshot on host A: its own pages and the warm pages as its base.
	snap := filepath.Join(tmp, "snap")
	chunkstoretest.Image{Seed: 2, Pool: 1, Pages: 300}.Write(t, snap)
	if err := os.Link(filepath.Join(warmA, "pages.img"), filepath.Join(snap, "base-1.img")); err != nil {
		t.Fatal(err)
	}
	// A paused sandbox on host A: the warm pages with a page changed.
	paused := filepath.Join(tmp, "paused")
	if err := os.MkdirAll(paused, 0o700); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(warmA, "pages.img"))
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(filepath.Join(paused, "pages.img"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	snapRoot, err := hostA.Export(ctx, snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	pausedRoot, err := hostA.Export(ctx, paused, nil)
	if err != nil {
		t.Fatal(err)
	}

	if err := hostB.Remember(ctx, warmB); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "snap-on-b")
	imp, err := hostB.Import(ctx, snapRoot.Root, out)
	if err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, snap, out)
	if linked := sameFile(t, filepath.Join(out, "base-1.img"), filepath.Join(warmB, "pages.img")); imp.LinkedFiles != 1 || !linked {
		t.Errorf("import linked %d files; base-1.img is host B's warm pages: %v", imp.LinkedFiles, linked)
	}
	out = filepath.Join(tmp, "paused-on-b")
	imp, err = hostB.Import(ctx, pausedRoot.Root, out)
	if err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, paused, out)
	if imp.Present == 0 || imp.Present < imp.Distinct-2 || imp.TransferredBytes >= imp.Bytes/4 {
		t.Errorf("import of a changed copy of the warm pages: %s", &imp)
	}
	t.Logf("changed copy: %s", &imp)
}

// After ExportBase of a template's warm image, an export of an image that
// holds one of its files by identity (a base-*.img) is written over the
// warm image's manifest: a few KB, imported byte for byte, its base kept
// by a collection while it lives. An image that holds none is flat.
func TestExportBase(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	b, err := chunkstore.OpenFile(filepath.Join(tmp, "store"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := chunkstore.New(b, chunkstore.Options{Immutable: true})
	if err != nil {
		t.Fatal(err)
	}
	warm := filepath.Join(tmp, "warm")
	chunkstoretest.Image{Seed: 1, Pool: 1, Pages: 1200}.Write(t, warm)
	image := func(name string, seed uint64) string {
		dir := filepath.Join(tmp, name)
		chunkstoretest.Image{Seed: seed, Pool: 1, Pages: 20}.Write(t, dir)
		if err := os.Link(filepath.Join(warm, "pages.img"), filepath.Join(dir, "base-1.img")); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	a, c := image("a", 2), image("c", 3)
	other := filepath.Join(tmp, "other")
	chunkstoretest.Image{Seed: 4, Pool: 2, Pages: 50}.Write(t, other)
	base, err := s.ExportBase(ctx, warm, map[string]string{"image": "warm"})
	if err != nil {
		t.Fatal(err)
	}
	var roots []chunkstore.Hash
	for _, dir := range []string{a, c} {
		st, err := s.Export(ctx, dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st.Base != base.Root || st.ManifestBytes*3 > base.ManifestBytes {
			t.Fatalf("%s: %s (%d bytes of manifest, over %s); warm %d bytes", dir, &st, st.ManifestBytes, st.Base, base.ManifestBytes)
		}
		again, err := s.Export(ctx, dir, nil)
		if err != nil || again.Root != st.Root {
			t.Fatalf("%s again: %v, root %s, want %s", dir, err, again.Root, st.Root)
		}
		roots = append(roots, st.Root)
	}
	if st, err := s.Export(ctx, other, nil); err != nil || st.Base != (chunkstore.Hash{}) {
		t.Fatalf("an image that shares no file: %v, over %s", err, st.Base)
	}
	gs, err := s.GC(ctx, chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return roots[1:], nil }), 0)
	if err != nil || gs.DeletedManifests != 2 || gs.LiveManifests != 2 {
		t.Fatalf("gc keeping c: %v %+v", err, gs)
	}
	plain, err := chunkstore.New(b, chunkstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "c-imported")
	if _, err := plain.Import(ctx, roots[1], out); err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, c, out)
	// The base collected (nothing over it live): the next export exports
	// it again, then itself over it.
	if _, err := s.GC(ctx, chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return nil, nil }), 0); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Export(ctx, a, nil); err != nil || st.Base != base.Root {
		t.Fatalf("export after its base was collected: %v, over %s, want %s", err, st.Base, base.Root)
	}
	// The base image gone: flat.
	if _, err := s.GC(ctx, chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return nil, nil }), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(warm); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Export(ctx, c, nil); err != nil || st.Base != (chunkstore.Hash{}) {
		t.Fatalf("export after its base image was deleted: %v, over %s", err, st.Base)
	}
}

// NoteBase stores nothing: the first export of an image over the noted
// base exports the base first.
func TestNoteBase(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	b, err := chunkstore.OpenFile(filepath.Join(tmp, "store"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := chunkstore.New(b, chunkstore.Options{Immutable: true})
	if err != nil {
		t.Fatal(err)
	}
	warm := filepath.Join(tmp, "warm")
	chunkstoretest.Image{Seed: 1, Pool: 1, Pages: 600}.Write(t, warm)
	a := filepath.Join(tmp, "a")
	chunkstoretest.Image{Seed: 2, Pool: 1, Pages: 20}.Write(t, a)
	if err := os.Link(filepath.Join(warm, "pages.img"), filepath.Join(a, "base-1.img")); err != nil {
		t.Fatal(err)
	}
	if err := s.NoteBase(ctx, warm, map[string]string{"kind": "warm-image"}); err != nil {
		t.Fatal(err)
	}
	var objects int
	b.List(ctx, "", func(chunkstore.Object) error { objects++; return nil })
	if objects != 0 {
		t.Fatalf("NoteBase stored %d objects", objects)
	}
	st, err := s.Export(ctx, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Manifest(ctx, st.Base)
	if err != nil || m.Meta["kind"] != "warm-image" {
		t.Fatalf("the base of the first export: %v, %+v", err, m)
	}
	out := filepath.Join(tmp, "a-imported")
	if _, err := s.Import(ctx, st.Root, out); err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, a, out)
}
