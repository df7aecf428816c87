package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
	"github.com/cellfork/cellfork/internal/clusterauth"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// oneSnapshot is a manager with one snapshot of team "acme"; it counts
// the lookups.
type oneSnapshot struct {
	dir   string
	asked *atomic.Int64
}

func (o oneSnapshot) SnapshotImage(ctx context.Context, id string) (string, map[string]string, error) {
	o.asked.Add(1)
	if team, _ := sandbox.TeamOf(ctx); id != "s1" || team != "acme" {
		return "", nil, errdefs.New(errdefs.ErrNotFound, "snapshot %q not found", id)
	}
	return o.dir, map[string]string{"snapshot": id}, nil
}

// A host's image endpoints: refused unsigned or signed as a gateway's
// (401, nothing read), a snapshot offered for its team only, its image
// imported by another host through the signed client, byte-exact, with
// nothing from the store (which has none of it); the API behind them is
// reached for everything else, the data plane's /internal/ paths too.
func TestPeerEndpoints(t *testing.T) {
	dir := t.TempDir()
	key := []byte("the cluster's internal key")
	log := slog.New(slog.DiscardHandler)
	shared, err := chunkstore.OpenFile(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := chunkstore.New(shared, chunkstore.Options{Immutable: true})
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "snap")
	chunkstoretest.Image{Seed: 1, Pool: 2, Pages: 300}.Write(t, img)
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	var asked atomic.Int64
	srv := httptest.NewServer((&peerServer{s: a, snaps: oneSnapshot{img, &asked}, key: func() []byte { return key }, log: log}).handler(api))
	defer srv.Close()
	call := func(method, path string, sign func(*http.Request)) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		if sign != nil {
			sign(req)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	peer := func(team string) func(*http.Request) {
		return func(r *http.Request) { clusterauth.SignPeer(r, key, team, time.Now()) }
	}
	gateway := func(r *http.Request) { clusterauth.Sign(r, key, "acme", "", time.Now()) }
	other := func(r *http.Request) { clusterauth.SignPeer(r, []byte("another key"), "acme", time.Now()) }

	for name, sign := range map[string]func(*http.Request){"unsigned": nil, "a gateway's signature": gateway, "another key": other} {
		for _, path := range []string{"/internal/images/offers?snapshot=s1", "/internal/images/manifests/" + strings.Repeat("a", 64)} {
			if code, _ := call("POST", path, sign); code != http.StatusUnauthorized {
				t.Errorf("%s: POST %s: %d, want 401", name, path, code)
			}
		}
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("refused calls looked %d snapshots up", n)
	}
	if code, _ := call("GET", "/sandboxes", nil); code != http.StatusTeapot {
		t.Fatalf("the API behind: %d", code)
	}
	if code, _ := call("GET", "/internal/images/x", func(r *http.Request) { r.Host = "49983-isb1.example.com" }); code != http.StatusTeapot {
		t.Errorf("a data-plane request under /internal/: %d, want the API's", code)
	}
	if code, body := call("POST", "/internal/images/offers?snapshot=s1", peer("other")); code != http.StatusNotFound {
		t.Errorf("another team's offer: %d %s", code, body)
	}
	if code, _ := call("GET", "/internal/images/offers", peer("acme")); code != http.StatusMethodNotAllowed {
		t.Errorf("GET offers: %d", code)
	}
	code, body := call("POST", "/internal/images/offers?snapshot=s1", peer("acme"))
	var offered struct {
		Root string `json:"root"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &offered) != nil {
		t.Fatalf("offer: %d %s", code, body)
	}

	// Another host imports it through its signed client.
	b, err := chunkstore.New(shared, chunkstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pc := newPeerClient()
	ci := chunkImages{s: b, log: log, peers: pc}
	ctx := sandbox.WithImagePeer(context.Background(), sandbox.ImagePeer{Snapshot: "s1", Root: offered.Root, Addr: strings.TrimPrefix(srv.URL, "http://")})
	if _, err := ci.Import(ctx, offered.Root, filepath.Join(dir, "unset")); err == nil {
		t.Fatal("a peer import by a host with no cluster key")
	}
	pc.set(func() []byte { return key })
	if _, err := ci.Import(ctx, offered.Root, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, img, filepath.Join(dir, "out"))
	root, _ := chunkstore.ParseHash(offered.Root)
	if ok, err := b.HasManifest(context.Background(), root); ok || err != nil {
		t.Fatalf("the offer wrote its manifest to the store: %v %v", ok, err)
	}
}
