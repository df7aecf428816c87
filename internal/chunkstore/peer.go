package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Handler serves the store's chunks and manifests to other hosts, read
// only: GET and HEAD of /chunks/<h[0:2]>/<h> and /manifests/<root>, from
// the host cache first, then the backend. A fork child placed on another
// host imports its image from the parent's host this way (PeerBackend),
// before or without an upload to the shared store. Callers mount it under
// their own authentication; what it serves is verified by the reader.
func (s *Store) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "read only", http.StatusMethodNotAllowed)
			return
		}
		key := strings.TrimPrefix(r.URL.Path, "/")
		if !servable(key) {
			http.Error(w, "no such object", http.StatusNotFound)
			return
		}
		var data []byte
		if s.cache != nil {
			if b, ok := s.cache.read(key, nil); ok {
				data = b
			}
		}
		if data == nil {
			b, err := s.b.Get(r.Context(), key)
			switch {
			case isNotFound(err):
				http.Error(w, "no such object", http.StatusNotFound)
				return
			case err != nil:
				http.Error(w, "store unavailable", http.StatusServiceUnavailable)
				return
			}
			data = b
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", fmt.Sprint(len(data)))
		if r.Method == http.MethodGet {
			w.Write(data)
		}
	})
}

// servable reports whether key names a chunk or a manifest.
func servable(key string) bool {
	if r, ok := strings.CutPrefix(key, "manifests/"); ok {
		_, err := ParseHash(r)
		return err == nil
	}
	if c, ok := strings.CutPrefix(key, "chunks/"); ok {
		h, err := ParseHash(c[strings.LastIndexByte(c, '/')+1:])
		return err == nil && key == ChunkKey(h)
	}
	return false
}

// PeerBackend reads another host's Store.Handler: a Backend for imports
// only (Get and Has; the rest fail with ErrFailedPrecondition). Safe for
// concurrent use.
type PeerBackend struct {
	base   string
	client *http.Client
}

// OpenPeer returns a backend reading the handler at baseURL (no trailing
// slash) through client (nil: a client with a 30s timeout). The client
// carries the cluster's authentication.
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
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i, k := range keys {
		g.Go(func() error {
			resp, err := p.do(gctx, http.MethodHead, k)
			switch {
			case err == nil:
				resp.Body.Close()
				found[i] = true
			case !isNotFound(err):
				return err
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
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

// Lock is a no-op: nothing is written through a peer, and its own store
// keeps its own lock.
func (p *PeerBackend) Lock(ctx context.Context, name string, exclusive bool) (context.Context, func(), error) {
	held, cancel := context.WithCancel(ctx)
	return held, cancel, nil
}
