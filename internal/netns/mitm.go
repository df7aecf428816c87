package netns

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Network rules (Policy.Transforms): for a TLS connection whose server
// name has a rule, the proxy
//   - connects to the host as for any TLS connection (dialAllowed: the
//     same policy decides, and a refusal is the same reset) and completes
//     TLS with it, verifying its certificate for the name against the
//     host's roots (Config.UpstreamRoots), so a sandbox that dials another
//     address while naming the host cannot draw the headers anywhere else;
//   - answers the sandbox's TLS with a certificate the daemon's CA signs
//     for the name (the sandbox trusts the CA: box hand-off), offering
//     HTTP/1.1 only;
//   - relays each request with the rule's headers set (replacing those the
//     sandbox sent under the same names) and streams the answers back,
//     keeping connections alive, upgrades (WebSocket) included.
// The headers live in the daemon only. Nothing here logs them: the HTTP
// machinery's own logs are discarded.

const (
	handshakeTimeout = 10 * time.Second
	idleTimeout      = 2 * time.Minute
	headerTimeout    = 30 * time.Second
)

// discard is the HTTP server's and proxy's error log.
var discard = log.New(io.Discard, "", 0)

// intercept serves one sandbox connection for the server name, which has a
// rule, over up (connected to the host, TLS not started). seen are the
// bytes already read from c (the ClientHello).
func (n *Network) intercept(ctx context.Context, c *net.TCPConn, seen []byte, name string, up *net.TCPConn, orig netip.AddrPort) {
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	upTLS, err := n.upstreamTLS(hctx, up, name)
	if err != nil {
		_ = c.SetLinger(0) // the sandbox sees what a refusal looks like
		return
	}
	cc := tls.Server(&replayConn{TCPConn: c, r: io.MultiReader(bytes.NewReader(seen), c)}, &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return n.cfg.CA.leaf(name) },
		NextProtos:     []string{"http/1.1"},
		MinVersion:     tls.VersionTLS12,
	})
	if err := cc.HandshakeContext(hctx); err != nil {
		upTLS.Close()
		return
	}
	var first struct {
		sync.Mutex
		c net.Conn
	}
	first.c = upTLS
	tr := &http.Transport{
		// The first request goes over the connection made above; later
		// ones (after the host closed it) are checked against the policy
		// again.
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			first.Lock()
			uc := first.c
			first.c = nil
			first.Unlock()
			if uc != nil {
				return uc, nil
			}
			dctx, cancel := context.WithTimeout(ctx, dialTimeout)
			defer cancel()
			tcp, err := n.dialAllowed(dctx, name, orig)
			if err != nil {
				return nil, err
			}
			return n.upstreamTLS(dctx, tcp, name)
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     idleTimeout,
		DisableCompression:  true,
	}
	defer func() {
		first.Lock()
		if first.c != nil {
			first.c.Close()
		}
		first.Unlock()
		tr.CloseIdleConnections()
	}()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "https", name, pr.In.Host
			// A transparent relay: what the sandbox sent stays as sent.
			pr.Out.URL.RawQuery = pr.In.URL.RawQuery
			for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
				if v, ok := pr.In.Header[h]; ok {
					pr.Out.Header[h] = v
				}
			}
			// The rules of now: a change applies to the next request.
			p := n.currentPolicy()
			for k, v := range p.TransformFor(name) {
				pr.Out.Header[k] = []string{v}
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorLog:      discard,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) {
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The certificate and the headers are for the name the sandbox
		// gave in TLS; a request for another host is not theirs.
		host := r.Host
		if hh, _, err := net.SplitHostPort(host); err == nil {
			host = hh
		}
		if !strings.EqualFold(strings.TrimSuffix(host, "."), name) {
			http.Error(w, "this connection is for "+name, http.StatusMisdirectedRequest)
			return
		}
		rp.ServeHTTP(w, r)
	})
	done := make(chan struct{})
	ln := &oneConnListener{c: &closeNotifyConn{Conn: cc, done: done}, done: done}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: headerTimeout, IdleTimeout: idleTimeout, ErrorLog: discard}
	go func() { _ = srv.Serve(ln) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	_ = srv.Close()
}

// upstreamTLS starts TLS over c to the host name, verifying its
// certificate; c is closed on failure.
func (n *Network) upstreamTLS(ctx context.Context, c net.Conn, name string) (*tls.Conn, error) {
	tc := tls.Client(c, &tls.Config{
		ServerName: name,
		RootCAs:    n.cfg.UpstreamRoots,
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
	})
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// replayConn reads from r (bytes already read, then the connection).
type replayConn struct {
	*net.TCPConn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// closeNotifyConn closes done when it is closed.
type closeNotifyConn struct {
	net.Conn
	once sync.Once
	done chan struct{}
}

func (c *closeNotifyConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}

// oneConnListener accepts its one connection, then waits for done.
type oneConnListener struct {
	mu   sync.Mutex
	c    net.Conn
	done chan struct{}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.c
	l.c = nil
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return &net.TCPAddr{} }
