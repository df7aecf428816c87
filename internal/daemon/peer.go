package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/clusterauth"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// A cluster host serves its snapshots' images to the other hosts, and
// imports theirs from them (docs/cluster.md, "Fork beyond a host"):
//
//	POST /internal/images/offers?snapshot=ID   a gateway asks the host to offer
//	                                           a snapshot's image: it is cut and
//	                                           its manifest encoded (the root
//	                                           its upload will write), answered
//	                                           as {"root": ...}
//	GET  /internal/images/manifests/<root>     an offered manifest (or a base)
//	GET  /internal/images/chunks/<h2>/<h>      a chunk of an offered image
//
// Every call must be signed with the cluster's internal key for this
// purpose (clusterauth.SignPeer): an unsigned call, or one a gateway
// signed for a client (clusterauth.Sign), is refused with 401 before
// anything is read. Nothing is served by path, and only offered images.
const peerPrefix = "/internal/images"

// snapshotImages is what the image endpoints need of the manager.
type snapshotImages interface {
	SnapshotImage(ctx context.Context, id string) (dir string, meta map[string]string, err error)
}

// peerServer serves the image endpoints in front of the host's API.
type peerServer struct {
	s     *chunkstore.Store
	snaps snapshotImages
	key   func() []byte
	log   *slog.Logger
}

func (p *peerServer) handler(next http.Handler) http.Handler {
	files := http.StripPrefix(peerPrefix, p.s.PeerHandler())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, peerPrefix+"/")
		if _, _, dataPlane := api.DataPlaneTarget(r); !ok || dataPlane {
			next.ServeHTTP(w, r)
			return
		}
		c, err := clusterauth.VerifyPeer(r, [][]byte{p.key()}, time.Now())
		if err != nil {
			api.WriteError(w, "", http.StatusUnauthorized, "the image endpoints take calls only from the cluster's hosts and gateways: "+err.Error())
			return
		}
		if rest == "offers" {
			if r.Method != http.MethodPost {
				w.Header().Set("Allow", "POST")
				api.WriteError(w, "", http.StatusMethodNotAllowed, "POST only")
				return
			}
			p.offer(w, r, c.Team)
			return
		}
		files.ServeHTTP(w, r)
	})
}

// offer offers the image of the team's snapshot the query names.
func (p *peerServer) offer(w http.ResponseWriter, r *http.Request, team string) {
	id := r.URL.Query().Get("snapshot")
	if id == "" {
		api.Fail(p.log, w, r, errdefs.New(errdefs.ErrInvalidArgument, "snapshot is required"))
		return
	}
	ctx := sandbox.WithTeam(r.Context(), team)
	dir, meta, err := p.snaps.SnapshotImage(ctx, id)
	if err != nil {
		api.Fail(p.log, w, r, err)
		return
	}
	st, err := p.s.Offer(ctx, dir, meta)
	if err != nil {
		api.Fail(p.log, w, r, fmt.Errorf("offering the image of snapshot %s: %w", id, err))
		return
	}
	p.log.Info("snapshot image offered to peers", "snapshot.id", id, "root", st.Root.String(), "bytes", st.Bytes,
		"chunks", st.Distinct, "files_remembered", st.Reused, "ms", st.Duration.Milliseconds())
	api.WriteJSON(w, http.StatusOK, map[string]any{"root": st.Root.String(), "bytes": st.Bytes})
}

// peerClient fetches images from other hosts' image endpoints, signing
// its calls with the cluster's internal key. Unset (a single host), it
// fetches nothing. Safe for concurrent use.
type peerClient struct {
	mu     sync.Mutex
	key    func() []byte // guarded by mu; nil until set
	client *http.Client
}

func newPeerClient() *peerClient {
	tr := &http.Transport{
		DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		// A peer answers from an offer it holds, in milliseconds; one
		// that went dark on a kept-alive connection (no refused dial to
		// say so) costs the fork this long before the store is read
		// instead (10 s before: cluster test fork-peer-unreachable).
		ResponseHeaderTimeout: 3 * time.Second,
		MaxIdleConnsPerHost:   32,
	}
	p := &peerClient{}
	p.client = &http.Client{Timeout: 30 * time.Second, Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		key := p.signingKey()
		if key == nil {
			return nil, errdefs.New(errdefs.ErrFailedPrecondition, "not a cluster host")
		}
		r = r.Clone(r.Context())
		clusterauth.SignPeer(r, key, "", time.Now())
		return tr.RoundTrip(r)
	})}
	return p
}

// set makes the client sign with key's answer (a cluster host's member).
func (p *peerClient) set(key func() []byte) {
	p.mu.Lock()
	p.key = key
	p.mu.Unlock()
}

func (p *peerClient) signingKey() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.key == nil {
		return nil
	}
	return p.key()
}

// backend returns the image endpoints of the host at addr (host:port).
func (p *peerClient) backend(addr string) (*chunkstore.PeerBackend, error) {
	if p == nil || p.signingKey() == nil {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "not a cluster host")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "image peer %q: want host:port", addr)
	}
	return chunkstore.OpenPeer("http://"+addr+peerPrefix, p.client), nil
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
