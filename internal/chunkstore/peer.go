package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/timing"
)

// A host serves the images it offers to other hosts, so an image can be
// imported from the host that holds it before (or without) its upload to
// the shared store: a fork child placed on another host than its parent's.
//
//	parent's host: Offer(dir, meta)   cut the image, encode its manifest (the
//	                                  same root its Export writes), keep
//	                                  where each chunk is
//	               PeerHandler        GET /manifests/<root>, /chunks/<h[0:2]>/<h>
//	                                  of offered images only, read from their
//	                                  files and hashed before they are sent
//	child's host:  ImportFrom(peer)   every object from the peer first,
//	                                  verified by its name; what the peer does
//	                                  not give, from the store
//
// A peer is trusted no more than the store: what it sends is verified as
// the store's is, and a peer that sends a wrong object or does not answer
// is not asked again during that import.

// OfferTTL is how long an offer is served after it was made.
const OfferTTL = 10 * time.Minute

// maxOffers bounds the offers a store keeps (the oldest go first).
const maxOffers = 256

// offer is an image a store serves to peers: its files, where each of its
// distinct stored chunks is in them, and its manifest and its bases'.
type offer struct {
	dir       string
	names     []string
	locs      map[Hash]where
	manifests map[Hash][]byte
	expires   time.Time
}

// Offer cuts the image directory dir and encodes its manifest as Export
// would (the same meta and base give the same root: an Export of dir
// after it writes the manifest the offer serves), and serves it to peers
// (PeerHandler) for OfferTTL. It uploads nothing: a noted base the store
// lacks, which Export would store first, is planned here and its manifest
// served with the image's. With
// Options.Immutable, the files it cut are remembered, so the image's
// Export does not cut them again. Phases: export.chunk, as Export.
func (s *Store) Offer(ctx context.Context, dir string, meta map[string]string) (st Stats, err error) {
	t0 := time.Now()
	defer func() {
		st.Duration = time.Since(t0)
		if err != nil {
			err = fmt.Errorf("offering %s: %w", dir, err)
		}
	}()
	phase := func(name string, start time.Time) {
		d := time.Since(start)
		st.Phases = append(st.Phases, Phase{name, d})
		timing.Add(ctx, name, d)
	}
	p, err := s.plan(ctx, dir, meta, Hash{}, &st, phase, true)
	if err != nil {
		return st, err
	}
	o := &offer{dir: dir, names: p.names, locs: p.locs, manifests: map[Hash][]byte{p.root: p.body}, expires: time.Now().Add(OfferTTL)}
	// Its bases: planned here (the store lacks it), or as the store holds
	// them (plan read and verified them).
	if p.baseBody != nil {
		o.manifests[p.base] = p.baseBody
		st.Base = p.base
	} else if p.bm != nil {
		for root := p.base; root != (Hash{}) && len(o.manifests) <= maxBaseDepth; {
			body, err := s.rawManifest(ctx, root)
			if err != nil {
				return st, fmt.Errorf("reading base %s: %w", root, err)
			}
			o.manifests[root] = body
			m, err := decode(body)
			if err != nil {
				return st, fmt.Errorf("base %s: %v: %w", root, err, errdefs.ErrCorrupt)
			}
			root = m.Base
		}
		st.Base = p.base
	}
	st.Root, st.ManifestBytes = p.root, len(p.body)
	s.offersMu.Lock()
	defer s.offersMu.Unlock()
	now := time.Now()
	for r, old := range s.offers {
		if now.After(old.expires) {
			delete(s.offers, r)
		}
	}
	if len(s.offers) >= maxOffers {
		var oldest Hash
		for r, old := range s.offers {
			if oldest == (Hash{}) || old.expires.Before(s.offers[oldest].expires) {
				oldest = r
			}
		}
		delete(s.offers, oldest)
	}
	if s.offers == nil {
		s.offers = map[Hash]*offer{}
	}
	s.offers[p.root] = o
	return st, nil
}

// rawManifest returns a manifest's bytes, verified, from the cache or the
// store.
func (s *Store) rawManifest(ctx context.Context, root Hash) ([]byte, error) {
	key := ManifestKey(root)
	if s.cache != nil {
		if b, ok := s.cache.read(key, nil); ok && Sum(b) == root {
			return b, nil
		}
	}
	b, err := s.b.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return b, verify("manifest", root, b)
}

// offered returns the manifest root names among the live offers.
func (s *Store) offered(root Hash) ([]byte, bool) {
	s.offersMu.Lock()
	defer s.offersMu.Unlock()
	now := time.Now()
	for _, o := range s.offers {
		if b, ok := o.manifests[root]; ok && now.Before(o.expires) {
			return b, true
		}
	}
	return nil, false
}

// offeredChunk reads chunk h from the files of a live offer that holds
// it, verified (a file deleted or changed since is skipped).
func (s *Store) offeredChunk(h Hash) ([]byte, bool) {
	type at struct {
		path string
		w    where
	}
	var found []at
	s.offersMu.Lock()
	now := time.Now()
	for _, o := range s.offers {
		if w, ok := o.locs[h]; ok && now.Before(o.expires) {
			found = append(found, at{filepath.Join(o.dir, o.names[w.file]), w})
		}
	}
	s.offersMu.Unlock()
	for _, a := range found {
		f, err := os.Open(a.path)
		if err != nil {
			continue
		}
		buf := make([]byte, a.w.size)
		_, err = f.ReadAt(buf, a.w.off)
		f.Close()
		if err == nil && Sum(buf) == h {
			return buf, true
		}
	}
	return nil, false
}

// PeerHandler serves the images this store offers (Offer) to other hosts,
// read only: GET and HEAD of /manifests/<root> (an offered image's
// manifest or one of its bases) and /chunks/<h[0:2]>/<h> (a chunk of an
// offered image, read from its files and hashed before it is sent).
// Nothing else is served: not the store, not the cache, nothing by path.
// Callers mount it behind their own authentication.
func (s *Store) PeerHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "read only", http.StatusMethodNotAllowed)
			return
		}
		var data []byte
		ok := false
		key := strings.TrimPrefix(r.URL.Path, "/")
		if rest, isManifest := strings.CutPrefix(key, "manifests/"); isManifest {
			if root, err := ParseHash(rest); err == nil {
				data, ok = s.offered(root)
			}
		} else if h, err := chunkOfKey(key); err == nil {
			data, ok = s.offeredChunk(h)
		}
		if !ok {
			http.Error(w, "no such object offered", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", fmt.Sprint(len(data)))
		if r.Method == http.MethodGet {
			w.Write(data)
		}
	})
}

// chunkOfKey returns the hash a chunk's key names (exactly ChunkKey's
// form).
func chunkOfKey(key string) (Hash, error) {
	c, ok := strings.CutPrefix(key, "chunks/")
	if !ok {
		return Hash{}, errdefs.New(errdefs.ErrInvalidArgument, "%q is not a chunk's key", key)
	}
	h, err := ParseHash(c[strings.LastIndexByte(c, '/')+1:])
	if err != nil || key != ChunkKey(h) {
		return Hash{}, errdefs.New(errdefs.ErrInvalidArgument, "%q is not a chunk's key", key)
	}
	return h, nil
}

// verifyKey checks that data is the object key names (a chunk or a
// manifest: both are named by their hash).
func verifyKey(key string, data []byte) error {
	if rest, ok := strings.CutPrefix(key, "manifests/"); ok {
		root, err := ParseHash(rest)
		if err != nil {
			return err
		}
		return verify("manifest", root, data)
	}
	h, err := chunkOfKey(key)
	if err != nil {
		return err
	}
	return verify("chunk", h, data)
}

// PeerBackend reads another host's PeerHandler: a Backend for imports
// only (Get and Has; the rest fail with ErrFailedPrecondition). Safe for
// concurrent use.
type PeerBackend struct {
	base   string
	client *http.Client
}

// OpenPeer returns a backend reading the handler at baseURL (no trailing
// slash) through client (nil: http.DefaultClient with a 30s timeout). The
// client carries the cluster's authentication.
func OpenPeer(baseURL string, client *http.Client) *PeerBackend {
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	return &PeerBackend{base: strings.TrimSuffix(baseURL, "/"), client: client}
}

func (p *PeerBackend) String() string { return "peer " + p.base }

func (p *PeerBackend) do(ctx context.Context, method, key string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, p.base+"/"+key, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return nil, err
		}
		return nil, fmt.Errorf("%s %s: the peer does not answer: %v: %w", method, key, err, errdefs.ErrUnavailable)
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		return resp, nil
	case resp.StatusCode == http.StatusNotFound:
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: %w", method, key, errdefs.ErrNotFound)
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: HTTP %d: %w", method, key, resp.StatusCode, errdefs.ErrUnavailable)
	}
	resp.Body.Close()
	return nil, fmt.Errorf("%s %s: HTTP %d", method, key, resp.StatusCode)
}

func (p *PeerBackend) Get(ctx context.Context, key string) ([]byte, error) {
	resp, err := p.do(ctx, http.MethodGet, key)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: cut short: %v: %w", key, err, errdefs.ErrUnavailable)
	}
	return data, nil
}

func (p *PeerBackend) Has(ctx context.Context, keys []string) ([]bool, error) {
	found := make([]bool, len(keys))
	for i, k := range keys {
		resp, err := p.do(ctx, http.MethodHead, k)
		switch {
		case err == nil:
			resp.Body.Close()
			found[i] = true
		case !isNotFound(err):
			return nil, err
		}
	}
	return found, nil
}

var errReadOnly = errdefs.New(errdefs.ErrFailedPrecondition, "a peer's chunk store is read only")

func (p *PeerBackend) Put(context.Context, string, []byte) error { return errReadOnly }
func (p *PeerBackend) Delete(context.Context, string) error      { return errReadOnly }
func (p *PeerBackend) Flush(context.Context) error               { return nil }
func (p *PeerBackend) List(context.Context, string, func(Object) error) error {
	return errReadOnly
}

// Lock is a no-op: nothing is written through a peer.
func (p *PeerBackend) Lock(ctx context.Context, name string, exclusive bool) (context.Context, func(), error) {
	held, cancel := context.WithCancel(ctx)
	return held, cancel, nil
}

// DefaultStoreWait is how long ImportFrom waits for the store to hold an
// object the peer did not give (its upload may be under way).
const DefaultStoreWait = 30 * time.Second

// ImportFrom is Import reading each manifest and chunk the cache lacks
// from peer first (verified by its name, as every read is), and from the
// store when the peer does not have it, does not answer, or sends bytes
// that are not what was asked: then the peer is not asked again during
// this import. An object the store does not hold yet is waited for (up to
// wait; 0 for DefaultStoreWait): the image's upload may be under way.
// Stats.Peer, PeerBytes and PeerMissed say what came from where, and
// Stats.PeerError why the peer was left (if it was).
func (s *Store) ImportFrom(ctx context.Context, root Hash, dir string, peer Backend, wait time.Duration) (Stats, error) {
	if wait <= 0 {
		wait = DefaultStoreWait
	}
	src := &peerFirst{Backend: s.b, peer: peer, wait: wait}
	st, err := s.importFrom(ctx, src, root, dir)
	st.Peer, st.PeerBytes, st.PeerMissed = int(src.got.Load()), src.gotBytes.Load(), int(src.missed.Load())
	if e := src.left.Load(); e != nil {
		st.PeerError = e.(error).Error()
	}
	return st, err
}

// peerFirst reads a peer, then the store (the Backend it embeds). Safe
// for concurrent use.
type peerFirst struct {
	Backend
	peer Backend
	wait time.Duration

	got, gotBytes, missed atomic.Int64
	left                  atomic.Value // error: why the peer is no longer asked
	once                  sync.Once
	// storeChunk reads a chunk from the store where the manifest says it
	// is (its pack, or its own object); set by the import once it read
	// the manifest (nil: the chunk's own object).
	storeChunk func(ctx context.Context, h Hash) ([]byte, error)
}

func (p *peerFirst) String() string { return p.peer.String() + ", then " + p.Backend.String() }

func (p *peerFirst) Get(ctx context.Context, key string) ([]byte, error) {
	if p.left.Load() == nil {
		data, err := p.peer.Get(ctx, key)
		if err == nil {
			err = verifyKey(key, data)
		}
		if err == nil {
			p.got.Add(1)
			p.gotBytes.Add(int64(len(data)))
			return data, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !isNotFound(err) {
			p.once.Do(func() { p.left.Store(err) })
		}
	}
	p.missed.Add(1)
	return p.fromStore(ctx, key)
}

// fromStore reads key from the store, waiting (up to p.wait) while the
// store does not hold it yet.
func (p *peerFirst) fromStore(ctx context.Context, key string) ([]byte, error) {
	deadline := time.Now().Add(p.wait)
	get := p.Backend.Get
	if h, err := chunkOfKey(key); err == nil && p.storeChunk != nil {
		get = func(ctx context.Context, _ string) ([]byte, error) { return p.storeChunk(ctx, h) }
	}
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		data, err := get(ctx, key)
		left := time.Until(deadline)
		if !isNotFound(err) || left <= 0 {
			return data, err
		}
		t := time.NewTimer(min(pause, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}
