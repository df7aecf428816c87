package chunkstore_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
	"github.com/cellfork/cellfork/internal/errdefs"
)

// A host imports an image from another host's store through its Handler:
// byte-exact, verified, the peer's cache first; a peer that lies is
// ErrCorrupt, one that is gone ErrUnavailable, and nothing else is served.
func TestPeerImport(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	chunkstoretest.Image{Seed: 3, Pool: 4, Pages: 400}.Write(t, img)
	fb, err := chunkstore.OpenFile(filepath.Join(dir, "a-store"))
	if err != nil {
		t.Fatal(err)
	}
	cacheA, err := chunkstore.OpenCache(filepath.Join(dir, "a-cache"), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	a, err := chunkstore.New(fb, chunkstore.Options{Cache: cacheA})
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.Export(ctx, img, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()

	cacheB, err := chunkstore.OpenCache(filepath.Join(dir, "b-cache"), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	b, err := chunkstore.New(chunkstore.OpenPeer(srv.URL, nil), chunkstore.Options{Cache: cacheB, Retry: chunkstore.Retry{Attempts: 2}})
	if err != nil {
		t.Fatal(err)
	}
	ist, err := b.Import(ctx, st.Root, filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, img, filepath.Join(dir, "out"))
	if ist.Transferred != st.Distinct {
		t.Fatalf("import from a peer: %s", &ist)
	}

	// Only chunks and manifests, only reads.
	for _, path := range []string{"/.lock-store", "/tmp/x", "/chunks/zz/" + st.Root.String(), "/manifests/../lock"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
	}
	resp, err := http.Post(srv.URL+"/"+chunkstore.ManifestKey(st.Root), "application/octet-stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", resp.StatusCode)
	}

	// A peer whose cache and store hold a bad chunk.
	m, err := a.Manifest(ctx, st.Root)
	if err != nil {
		t.Fatal(err)
	}
	h := m.Hashes()[0]
	p := filepath.Join(cacheA.Dir(), chunkstore.ChunkKey(h))
	data, _ := os.ReadFile(p)
	data[0] ^= 1
	os.WriteFile(p, data, 0o600)
	cold, _ := chunkstore.New(chunkstore.OpenPeer(srv.URL, nil), chunkstore.Options{Retry: chunkstore.Retry{Attempts: 2}})
	if _, err := cold.Import(ctx, st.Root, filepath.Join(dir, "bad")); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("import from a peer serving a bad chunk: %v", err)
	}
	other := filepath.Join(dir, "other")
	chunkstoretest.Image{Seed: 9, Pool: 10, Pages: 50}.Write(t, other)
	if _, err := cold.Export(ctx, other, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("export to a peer: %v", err)
	}
	srv.Close()
	if _, err := cold.Import(ctx, st.Root, filepath.Join(dir, "gone")); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("import from a peer that is gone: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 6 { // img, other, a-store, a-cache, b-cache, out
		t.Fatalf("failed imports left files: %v", ents)
	}
}
