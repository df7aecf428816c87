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

// With Options.Immutable, a file exported before (by any of its names: a
// hard link in another image) is not read again, and the manifest is the
// one a full read gives; a file written since is read again.
func TestImmutableRemembersFiles(t *testing.T) {
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
	a := filepath.Join(tmp, "a")
	chunkstoretest.Image{Seed: 1, Pool: 1, Pages: 600, ZeroRun: 20}.Write(t, a)
	first, err := s.Export(ctx, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	if first.Reused != 0 {
		t.Fatalf("first export reused %d files", first.Reused)
	}
	// b holds a's pages.img as a hard link, as a snapshot holds its base.
	bdir := filepath.Join(tmp, "b")
	chunkstoretest.Image{Seed: 2, Pool: 1, Pages: 300}.Write(t, bdir)
	if err := os.Link(filepath.Join(a, "pages.img"), filepath.Join(bdir, "base-a.img")); err != nil {
		t.Fatal(err)
	}
	got, err := s.Export(ctx, bdir, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := plain.Export(ctx, bdir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Reused != 1 || got.Root != want.Root || got.ZeroChunks != want.ZeroChunks || got.Chunks != want.Chunks {
		t.Fatalf("remembered export %s (reused %d), full read %s", &got, got.Reused, &want)
	}
	// A file written since (another modification time) is read again.
	p := filepath.Join(a, "checkpoint.img")
	data, _ := os.ReadFile(p)
	data[0] ^= 0xff
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Second)
	if err := os.Chtimes(p, later, later); err != nil {
		t.Fatal(err)
	}
	again, err := s.Export(ctx, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Root == first.Root || again.Reused != first.Files-1 {
		t.Fatalf("after a write: root %s (first %s), reused %d of %d files", again.Root, first.Root, again.Reused, first.Files)
	}
	// And what it exported imports back byte for byte.
	out := filepath.Join(tmp, "b-imported")
	if _, err := s.Import(ctx, got.Root, out); err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, bdir, out)
}
