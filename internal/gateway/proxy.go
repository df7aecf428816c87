package gateway

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/clusterauth"
	"github.com/cellfork/cellfork/internal/timing"
)

// hop is where forward sends a request: a host (the call signed, for
// team, with the id a create takes) or another region's gateway (as the
// client sent it).
type hop struct {
	scheme, host, path string // the target URL's
	toHost             bool
	control            bool // a control-plane call (else the data plane's)
	team, mint         string
}

// toHost is a control-plane call to a host, for team.
func toHost(addr, team, mint string) hop {
	return hop{scheme: "http", host: addr, toHost: true, control: true, team: team, mint: mint}
}

// intoSandbox is a data-plane request to a host.
func intoSandbox(addr string) hop { return hop{scheme: "http", host: addr, toHost: true} }

// toGateway is a request passed on to another region's gateway at base.
func toGateway(base string) (hop, error) {
	u, err := url.Parse(base)
	if err != nil {
		return hop{}, err
	}
	return hop{scheme: u.Scheme, host: u.Host, path: strings.TrimSuffix(u.Path, "/")}, nil
}

// forwarding is one request on its way through the gateway's proxy: it
// rides in the request's context, so that one ReverseProxy serves all.
type forwarding struct {
	hop
	modify      func(*http.Response) error
	body        []byte // a small request body, read whole (nil: streamed)
	reqID       string
	endUpstream func()
	once        sync.Once
	// The reverse proxy flushes from a timer goroutine too: these are
	// atomic.
	eof     atomic.Bool // the answer's body has been read to its end
	sized   atomic.Bool // the answer has a Content-Length
	flushed atomic.Bool // some of the answer has been flushed to the client
}

// skipFlush reports whether the flush after a write can be left to the
// server's end of the answer: the write reached the end of the answer's
// body, and the answer's framing is settled (its length known, or a
// flush already made it chunked), so that leaving it changes nothing but
// the number of writes.
func (f *forwarding) skipFlush() bool { return f.eof.Load() && (f.sized.Load() || f.flushed.Load()) }

func (f *forwarding) end() { f.once.Do(f.endUpstream) }

type forwardingKey struct{}

// smallBody is the largest request body read whole before it is
// forwarded (so that its headers and body leave in one write).
const smallBody = 64 << 10

// newProxy returns the gateway's reverse proxy. It streams both ways and
// flushes every write (run_code's events, Connect streams), except the
// last, which leaves with the end of the answer.
func (g *Gateway) newProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:       g.rewrite,
		Transport:     g.toHosts,
		FlushInterval: -1,
		BufferPool:    bufferPool{},
		ModifyResponse: func(resp *http.Response) error {
			f := resp.Request.Context().Value(forwardingKey{}).(*forwarding)
			f.end()
			if resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
				resp.Body = &eofBody{ReadCloser: resp.Body, f: f}
				f.sized.Store(resp.ContentLength >= 0)
			}
			if f.modify != nil {
				return f.modify(resp)
			}
			return nil
		},
		ErrorHandler: g.proxyError,
	}
}

func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	f := pr.Out.Context().Value(forwardingKey{}).(*forwarding)
	pr.Out.URL.Scheme, pr.Out.URL.Host = f.scheme, f.host
	pr.Out.URL.Path = f.path + pr.In.URL.Path
	pr.Out.Host = pr.In.Host // the host routes the data plane by it
	pr.Out.Header.Del("X-Request-Id")
	if f.body != nil {
		// In memory, the transport writes it with the headers.
		pr.Out.Body = io.NopCloser(bytes.NewReader(f.body))
	}
	timing.Inject(pr.Out.Context(), pr.Out.Header) // with tracing: the host's spans join the gateway's
	if f.toHost {
		if f.control {
			// Hosts trust the signature; the client's credentials
			// stay here. (On the data plane, Authorization names
			// envd's user: it goes on.)
			pr.Out.Header.Del("X-API-KEY")
			pr.Out.Header.Del("Authorization")
		}
		clusterauth.Sign(pr.Out, g.secrets.Load().Internal, f.team, f.mint, time.Now())
	}
}

func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	f := r.Context().Value(forwardingKey{}).(*forwarding)
	f.end()
	if r.Context().Err() != nil {
		return // the client went away
	}
	g.log.Warn("forwarding failed", "request.id", f.reqID, "to", f.host, "err", err)
	if id, _, ok := api.DataPlaneTarget(r); ok {
		api.ProxyError(w, f.reqID, id, http.StatusBadGateway, "The sandbox is not reachable: its host does not answer")
		return
	}
	api.WriteError(w, f.reqID, http.StatusBadGateway, "the sandbox's host does not answer; retry later")
}

// forward proxies r to h, streaming both ways; modify, if not nil, may
// rewrite the answer.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, h hop, modify func(*http.Response) error) {
	f := &forwarding{hop: h, modify: modify, reqID: r.Header.Get("X-Request-Id")}
	// The upstream phase lasts until the answer's headers; with tracing
	// on, its span is the one the host's request span continues.
	ctx, end := timing.Start(r.Context(), "upstream")
	f.endUpstream = end
	defer f.end()
	r = r.WithContext(context.WithValue(ctx, forwardingKey{}, f))
	// A small body of known length is read first, so that the request
	// leaves in one write (the transport writes a streamed body's
	// headers on their own) and the host reads it in one.
	if r.ContentLength > 0 && r.ContentLength <= smallBody && r.Header.Get("Upgrade") == "" {
		f.body = make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, f.body); err != nil {
			f.end()
			if r.Context().Err() == nil {
				api.WriteError(w, f.reqID, http.StatusBadRequest, "reading the request body: "+err.Error())
			}
			return
		}
	}
	if h.toHost && !h.control && modify == nil && !g.noDirect && direct(r, f) {
		g.forwardDirect(w, r, f)
		return
	}
	_ = http.NewResponseController(w).EnableFullDuplex()
	g.proxy.ServeHTTP(&lastWriteWriter{ResponseWriter: w, f: f}, r)
}

// eofBody notes when an answer's body has been read to its end.
type eofBody struct {
	io.ReadCloser
	f *forwarding
}

func (b *eofBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.f.eof.Store(true)
	}
	return n, err
}

// lastWriteWriter skips the proxy's flush of the answer's last write
// (skipFlush): the server writes it with the end of the answer (a chunked
// answer's last chunk and its terminator in one write, not two), as soon
// as the handler returns.
type lastWriteWriter struct {
	http.ResponseWriter
	f *forwarding
}

func (w *lastWriteWriter) FlushError() error {
	if w.f.skipFlush() {
		return nil
	}
	w.f.flushed.Store(true)
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection (full
// duplex, the hijack of an upgrade).
func (w *lastWriteWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// bufferPool lends the proxy its copy buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }
