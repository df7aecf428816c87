package chunkstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
	"github.com/cellfork/cellfork/internal/errdefs"
)

// peerSetup is a shared store, host A's store over it holding an offered
// image (a snapshot over a noted base: a warm image it hard-links a file
// of), and A's PeerHandler behind a server whose answers a test can spoil.
type peerSetup struct {
	dir, img string
	shared   chunkstore.Backend
	a        *chunkstore.Store
	offer    chunkstore.Stats
	meta     map[string]string
	srv      *httptest.Server
	lie      atomic.Bool  // flip a byte of every chunk served
	served   atomic.Int64 // objects served
}

func newPeerSetup(t *testing.T, pack int) *peerSetup {
	t.Helper()
	ctx := context.Background()
	p := &peerSetup{dir: t.TempDir(), meta: map[string]string{"snapshot": "s1"}}
	var err error
	if p.shared, err = chunkstore.OpenFile(filepath.Join(p.dir, "store")); err != nil {
		t.Fatal(err)
	}
	if p.a, err = chunkstore.New(p.shared, chunkstore.Options{Immutable: true, PackBytes: pack}); err != nil {
		t.Fatal(err)
	}
	warm := filepath.Join(p.dir, "warm")
	chunkstoretest.Image{Seed: 3, Pool: 4, Pages: 400}.Write(t, warm)
	if err := p.a.NoteBase(ctx, warm, map[string]string{"kind": "warm-image"}); err != nil {
		t.Fatal(err)
	}
	// The snapshot: the warm pages by identity, and state of its own.
	p.img = filepath.Join(p.dir, "snap")
	chunkstoretest.Image{Seed: 5, Pool: 4, Pages: 300}.Write(t, p.img)
	if err := os.Link(filepath.Join(warm, "pages.img"), filepath.Join(p.img, "base-pages.img")); err != nil {
		t.Fatal(err)
	}
	if p.offer, err = p.a.Offer(ctx, p.img, p.meta); err != nil {
		t.Fatal(err)
	}
	if p.offer.Base.IsZero() {
		t.Fatalf("the offer is not over the warm image: %s", &p.offer)
	}
	h := p.a.PeerHandler()
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		if rec.Code == http.StatusOK {
			p.served.Add(1)
			if p.lie.Load() && strings.HasPrefix(r.URL.Path, "/chunks/") {
				body[len(body)/2] ^= 1
			}
		}
		w.WriteHeader(rec.Code)
		w.Write(body)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// importer is another host's store over the shared one, with a cache.
func (p *peerSetup) importer(t *testing.T, name string) *chunkstore.Store {
	t.Helper()
	cache, err := chunkstore.OpenCache(filepath.Join(p.dir, name+"-cache"), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cache.Flush)
	s, err := chunkstore.New(p.shared, chunkstore.Options{Cache: cache, Retry: chunkstore.Retry{Attempts: 2}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (p *peerSetup) peer() *chunkstore.PeerBackend { return chunkstore.OpenPeer(p.srv.URL, nil) }

// An offered image imports from its host before it is uploaded: every
// object from the peer, byte-exact; its export then writes the same root,
// without cutting its files again.
func TestPeerImport(t *testing.T) {
	for _, pack := range []int{0, 256 << 10} {
		t.Run(fmt.Sprintf("pack=%d", pack), func(t *testing.T) { testPeerImport(t, pack) })
	}
}

func testPeerImport(t *testing.T, pack int) {
	ctx := context.Background()
	p := newPeerSetup(t, pack)
	for _, root := range []chunkstore.Hash{p.offer.Root, p.offer.Base} {
		if ok, err := p.a.HasManifest(ctx, root); err != nil || ok {
			t.Fatalf("the offer uploaded manifest %s: %v %v", root, ok, err)
		}
	}
	out := filepath.Join(p.dir, "out")
	st, err := p.importer(t, "b").ImportFrom(ctx, p.offer.Root, out, p.peer(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, p.img, out)
	if st.Peer == 0 || st.PeerMissed != 0 || st.PeerError != "" || st.PeerBytes == 0 {
		t.Fatalf("import from the peer: %s (peer error %q)", &st, st.PeerError)
	}
	ex, err := p.a.Export(ctx, p.img, p.meta)
	if err != nil {
		t.Fatal(err)
	}
	if ex.Root != p.offer.Root || ex.Base != p.offer.Base || ex.Reused != ex.Files {
		t.Fatalf("export after the offer: root %s over %s (offered %s over %s), %d of %d files remembered", ex.Root, ex.Base, p.offer.Root, p.offer.Base, ex.Reused, ex.Files)
	}
	// Offered again, its base now read from the store: the same root, and
	// still imported whole from the peer.
	again, err := p.a.Offer(ctx, p.img, p.meta)
	if err != nil || again.Root != p.offer.Root || again.Base != p.offer.Base {
		t.Fatalf("offered again: %v %s", err, &again)
	}
	st, err = p.importer(t, "c").ImportFrom(ctx, again.Root, filepath.Join(p.dir, "again"), p.peer(), time.Second)
	if err != nil || st.PeerMissed != 0 {
		t.Fatalf("import of the offer over a stored base: %v %s", err, &st)
	}
	chunkstoretest.Equal(t, p.img, filepath.Join(p.dir, "again"))
}

// A peer that sends a wrong chunk is caught, left, and the store read
// instead, waiting for the upload under way; one that is gone, the same;
// with neither, the import fails cleanly.
func TestPeerFallsBackToTheStore(t *testing.T) {
	for _, pack := range []int{0, 256 << 10} {
		t.Run(fmt.Sprintf("pack=%d", pack), func(t *testing.T) { testPeerFallsBackToTheStore(t, pack) })
	}
}

func testPeerFallsBackToTheStore(t *testing.T, pack int) {
	ctx := context.Background()
	p := newPeerSetup(t, pack)

	// Wrong bytes, the upload 300 ms later.
	p.lie.Store(true)
	go func() {
		time.Sleep(300 * time.Millisecond)
		if _, err := p.a.Export(ctx, p.img, p.meta); err != nil {
			t.Error(err)
		}
	}()
	out := filepath.Join(p.dir, "lied")
	st, err := p.importer(t, "b").ImportFrom(ctx, p.offer.Root, out, p.peer(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, p.img, out)
	if st.PeerMissed == 0 || !strings.Contains(st.PeerError, "hash to") {
		t.Fatalf("import from a lying peer: %s (peer error %q)", &st, st.PeerError)
	}
	// It stopped asking the peer after the first wrong chunk (the 16
	// fetches in flight then aside).
	if served := p.served.Load(); served > int64(st.Peer)+17 || int(served) >= st.Distinct {
		t.Errorf("the peer was asked %d times for %d objects taken from it", served, st.Peer)
	}

	// The peer gone: all from the store.
	p.lie.Store(false)
	p.srv.Close()
	out = filepath.Join(p.dir, "gone")
	st, err = p.importer(t, "c").ImportFrom(ctx, p.offer.Root, out, p.peer(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, p.img, out)
	if st.Peer != 0 || !strings.Contains(st.PeerError, "does not answer") {
		t.Fatalf("import with the peer gone: %s (peer error %q)", &st, st.PeerError)
	}

	// Neither the peer nor the store has it: NotFound after the wait,
	// nothing left behind.
	other := filepath.Join(p.dir, "other")
	chunkstoretest.Image{Seed: 9, Pool: 10, Pages: 50}.Write(t, other)
	o, err := p.a.Offer(ctx, other, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	_, err = p.importer(t, "d").ImportFrom(ctx, o.Root, filepath.Join(p.dir, "never"), p.peer(), 300*time.Millisecond)
	if !errors.Is(err, errdefs.ErrNotFound) || time.Since(t0) < 300*time.Millisecond {
		t.Fatalf("import of an image neither has: %v after %v", err, time.Since(t0))
	}
	if _, err := os.Stat(filepath.Join(p.dir, "never")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed import left its directory: %v", err)
	}
}

// The handler serves offered images only: their manifests and chunks, not
// the store's other objects, nothing by path, nothing once their files are
// gone, and only reads.
func TestPeerHandlerServesOffersOnly(t *testing.T) {
	ctx := context.Background()
	p := newPeerSetup(t, 0)
	get := func(method, path string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, p.srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, body := get("GET", "/"+chunkstore.ManifestKey(p.offer.Base)) // the warm image's, planned
	if code != 200 {
		t.Fatalf("the offer's base manifest: %d", code)
	}
	m, err := chunkstore.Decode(body, p.offer.Base)
	if err != nil {
		t.Fatal(err)
	}
	// An image exported to the store but not offered.
	stored := filepath.Join(p.dir, "stored")
	chunkstoretest.Image{Seed: 7, Pool: 8, Pages: 60}.Write(t, stored)
	ex, err := p.a.Export(ctx, stored, nil)
	if err != nil {
		t.Fatal(err)
	}
	sm, err := p.a.Manifest(ctx, ex.Root)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{
		"/" + chunkstore.ManifestKey(ex.Root), "/" + chunkstore.ChunkKey(sm.Files[0].Chunks[0].Hash),
		"/gc/epoch", "/.lock-store", "/chunks/zz/" + p.offer.Root.String(), "/manifests/../store/gc/epoch",
		"/" + filepath.Join(p.img, "pages.img"), "/chunks/" + p.offer.Root.String(),
	} {
		if code, _ := get("GET", path); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, code)
		}
	}
	if code, _ := get("POST", "/"+chunkstore.ManifestKey(p.offer.Root)); code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", code)
	}
	var h chunkstore.Hash
	for _, c := range m.Files[0].Chunks { // checkpoint.img of the warm image: not in the snapshot
		if !c.Zero {
			h = c.Hash
		}
	}
	if code, _ := get("GET", "/"+chunkstore.ChunkKey(h)); code != http.StatusNotFound {
		t.Errorf("a chunk of the base the offer does not hold: %d", code)
	}
	// A chunk of a (flat) offer while its file is there, verified; then not.
	flat := filepath.Join(p.dir, "flat")
	chunkstoretest.Image{Seed: 11, Pool: 12, Pages: 60}.Write(t, flat)
	fo, err := p.a.Offer(ctx, flat, nil)
	if err != nil {
		t.Fatal(err)
	}
	code, body = get("GET", "/"+chunkstore.ManifestKey(fo.Root))
	if code != 200 {
		t.Fatalf("the offered manifest: %d", code)
	}
	fm, err := chunkstore.Decode(body, fo.Root)
	if err != nil {
		t.Fatal(err)
	}
	ck := fm.Files[0].Chunks[0].Hash
	if code, b := get("GET", "/"+chunkstore.ChunkKey(ck)); code != 200 || chunkstore.Sum(b) != ck {
		t.Fatalf("an offered chunk: %d", code)
	}
	os.RemoveAll(flat)
	if code, _ := get("GET", "/"+chunkstore.ChunkKey(ck)); code != http.StatusNotFound {
		t.Errorf("a chunk of an offer whose files are gone: %d", code)
	}
	if _, err := p.importer(t, "f").ImportFrom(ctx, fo.Root, filepath.Join(p.dir, "f"), p.peer(), 200*time.Millisecond); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("import of an offer whose files are gone (not uploaded): %v", err)
	}
}
