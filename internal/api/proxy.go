package api

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/api/apitypes"
	"github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// streamCoalesce is how long a streamed answer from a sandbox may wait to
// leave with what follows it: the pieces an agent flushes within it (a
// run_code's events, then the end of the answer) go out in one write, so
// each hop after this one (a gateway, the client) wakes once instead of
// once a piece. An answer's end is never held back; its headers leave
// within this time, so a stream that stays silent is seen to have begun.
const streamCoalesce = time.Millisecond

// target is a port inside a sandbox.
type target struct {
	sandboxID string
	port      int
}

// hostRE matches the left-most label of "{port}-{sandboxID}.{domain}".
var hostRE = regexp.MustCompile(`^([0-9]{1,5})-([a-z0-9]{1,64})\.`)

// dataPlaneTarget finds the sandbox port a request is for: the E2B routing
// headers first, then the Host form.
func dataPlaneTarget(r *http.Request) (target, bool) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		port, _ := strconv.Atoi(r.Header.Get("E2b-Sandbox-Port"))
		return target{id, port}, true
	}
	if m := hostRE.FindStringSubmatch(r.Host); m != nil {
		port, _ := strconv.Atoi(m[1])
		return target{m[2], port}, true
	}
	return target{}, false
}

// proxyError is the edge's answer the SDKs understand (spec §4.7).
func proxyError(w http.ResponseWriter, reqID, sandboxID string, status int, msg string) {
	writeJSON(w, status, apitypes.ProxyError{SandboxID: sandboxID, Message: msg, Code: status, RequestID: reqID})
}

// tooLarge refuses an upload past the limit. The rest of the body is never
// read, so the connection cannot carry another request: say so, or a
// client reusing it sees EOF on its next request.
func (s *Server) tooLarge(w http.ResponseWriter, reqID, sandboxID string) {
	w.Header().Set("Connection", "close")
	proxyError(w, reqID, sandboxID, http.StatusRequestEntityTooLarge,
		fmt.Sprintf("upload larger than the limit of %d bytes", s.cfg.MaxUploadBytes))
}

// errUploadTooLarge marks an upload cut off at the configured limit.
var errUploadTooLarge = errors.New("upload too large")

// limitedBody fails once more than n bytes were read.
type limitedBody struct {
	io.ReadCloser
	n int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n -= int64(n)
	if b.n < 0 {
		return n, errUploadTooLarge
	}
	return n, err
}

func (s *Server) proxy(w http.ResponseWriter, r *http.Request, t target, reqID string) {
	t0 := time.Now()
	if t.port < 1 || t.port > 65535 {
		proxyError(w, reqID, t.sandboxID, http.StatusBadRequest, "invalid sandbox port")
		return
	}
	// E2B's lifecycle.autoResume: a request the sandbox would take wakes
	// it (for the default lifetime); /health never does.
	wake := func(sb *sandbox.Sandbox) bool { return r.URL.Path != "/health" && s.checkAccess(r, t, sb) == nil }
	ep, err := s.m.Endpoint(r.Context(), t.sandboxID, wake)
	if errors.Is(err, errdefs.ErrUnavailable) {
		proxyError(w, reqID, t.sandboxID, http.StatusBadGateway, errdefs.UserMessage(err))
		return
	}
	if err != nil {
		// The SDKs key on "was not found", and for a sandbox that does
		// not exist (or was killed) E2B says just that; otherwise the
		// detail says why (paused, or died: out of memory).
		msg := "The sandbox was not found"
		if !errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, sandbox.ErrDied) {
			msg += ": " + errdefs.UserMessage(err)
		}
		proxyError(w, reqID, t.sandboxID, http.StatusBadGateway, msg)
		return
	}
	tr, sb, alive := ep.Transport, ep.Sandbox, ep.Alive
	if d := s.checkAccess(r, t, sb); d != nil {
		s.authFailed(d.reason)
		d.Write(w, reqID, t.sandboxID)
		return
	}
	// Close the request body before returning, whatever the upstream read
	// of it: in full-duplex mode (below) the server would otherwise drain
	// it after the handler, and reaching its end there starts a read of
	// the next request that races the server's own and panics with
	// "invalid concurrent Body.Read call" (golang/go#68560), dropping the
	// connection. It happened on every body sent to a closed port. Not
	// after a WebSocket upgrade: the connection is no longer the server's.
	body := r.Body
	defer func() {
		if tw, ok := w.(*timedWriter); !ok || tw.status != http.StatusSwitchingProtocols {
			body.Close()
		}
	}()
	if t.port == envd.Port && r.URL.Path == "/init" {
		// The daemon's alone: it sets the sandbox's environment and limits.
		proxyError(w, reqID, t.sandboxID, http.StatusForbidden, "POST /init is the daemon's; give env vars and limits when creating the sandbox")
		return
	}
	if t.port == envd.Port && r.Method == http.MethodPost && r.URL.Path == "/files" {
		if r.ContentLength > s.cfg.MaxUploadBytes {
			s.tooLarge(w, reqID, t.sandboxID)
			return
		}
		r.Body = &limitedBody{ReadCloser: r.Body, n: s.cfg.MaxUploadBytes}
	}
	// Requests in flight end when the sandbox's box goes away.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(alive, cancel)()
	timing.Since(ctx, "route", t0)
	// The upstream phase lasts until the response's headers; its span is
	// the parent of whatever the agent does (the traceparent it gets).
	ctx, endUpstream := timing.Start(ctx, "upstream")
	var once sync.Once
	defer once.Do(endUpstream)
	r = r.WithContext(ctx)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "sandbox:" + strconv.Itoa(t.port)
			pr.Out.Host = pr.In.Host
			// E2B's maskRequestHost, for user ports: the server inside sees
			// the mask, and the caller's host in X-Forwarded-Host.
			if sb.Network.MaskRequestHost != "" && t.port != envd.Port {
				pr.Out.Header.Set("X-Forwarded-Host", pr.In.Host)
				pr.Out.Host = sb.Network.MaskedHost(t.port)
			}
			for _, h := range []string{"X-Access-Token", "E2b-Traffic-Access-Token", "X-Api-Key"} {
				pr.Out.Header.Del(h)
			}
			timing.Inject(pr.Out.Context(), pr.Out.Header)
		},
		Transport:     tr,
		FlushInterval: -1, // flushes go through the coalescer
		ModifyResponse: func(resp *http.Response) error {
			once.Do(endUpstream)
			if resp.StatusCode >= 500 {
				s.agentError(t.port, "status_5xx")
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			once.Do(endUpstream)
			switch {
			case errors.Is(err, errUploadTooLarge):
				s.tooLarge(w, reqID, t.sandboxID)
			case alive.Err() != nil:
				s.agentError(t.port, "gone")
				msg := "the sandbox went away"
				if _, err := s.m.Endpoint(r.Context(), t.sandboxID, nil); err != nil {
					msg = errdefs.UserMessage(err)
				}
				proxyError(w, reqID, t.sandboxID, http.StatusBadGateway, "The sandbox was not found: "+msg)
			case r.Context().Err() != nil:
				// The client went away; nobody to answer.
			case errors.Is(err, syscall.ECONNREFUSED):
				s.agentError(t.port, "refused")
				proxyError(w, reqID, t.sandboxID, http.StatusBadGateway, "The sandbox is running but port is not open")
			default:
				s.agentError(t.port, "unreachable")
				s.log.Warn("proxy error", "request.id", reqID, "sandbox.id", t.sandboxID, "port", t.port, "err", err)
				proxyError(w, reqID, t.sandboxID, http.StatusBadGateway, "The sandbox is not reachable")
			}
		},
	}
	// Streams read the request body while writing the response (stdin,
	// Connect client streams); without full duplex the server closes the
	// body once the response starts, and the transport then drops the
	// upstream connection mid-response.
	_ = http.NewResponseController(w).EnableFullDuplex()
	defer resetOnAbort(w)
	cw := &coalescer{ResponseWriter: w}
	defer cw.stop()
	rp.ServeHTTP(cw, r)
}

// coalescer holds a proxied stream's flushes back by streamCoalesce, so
// that what the agent flushed piece by piece within it leaves in one write
// (the reverse proxy flushes every piece of a stream at once, whatever its
// FlushInterval).
type coalescer struct {
	http.ResponseWriter
	mu      sync.Mutex
	t       *time.Timer
	pending bool // a flush is scheduled
	done    bool // the handler returned: the server flushes the rest
}

func (c *coalescer) WriteHeader(code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ResponseWriter.WriteHeader(code)
}

func (c *coalescer) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ResponseWriter.Write(b)
}

// Flush schedules a flush streamCoalesce from now, unless one is.
func (c *coalescer) Flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done || c.pending {
		return
	}
	c.pending = true
	if c.t == nil {
		c.t = time.AfterFunc(streamCoalesce, c.flushNow)
	} else {
		c.t.Reset(streamCoalesce)
	}
}

func (c *coalescer) flushNow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = false
	if !c.done {
		_ = http.NewResponseController(c.ResponseWriter).Flush()
	}
}

// stop ends the flushes (the handler is returning).
func (c *coalescer) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = true
	if c.t != nil {
		c.t.Stop()
	}
}

// Unwrap lets http.ResponseController reach the connection (full duplex,
// hijacking for upgrades).
func (c *coalescer) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// resetOnAbort resets the client's connection when the response was cut
// short (the reverse proxy aborts with http.ErrAbortHandler: the sandbox's
// box went away mid-stream, or the upstream failed). Over HTTP/1.1 a clean
// close in the middle of a chunked body reads as the server's protocol
// error; a reset reads as the dropped connection it is, as an HTTP/2
// stream reset does on E2B, and that is what the SDKs check the sandbox's
// health on (and then say it was killed). Deferred by the handler.
func resetOnAbort(w http.ResponseWriter) {
	v := recover()
	if v == nil {
		return
	}
	if v == http.ErrAbortHandler {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			if c, ok := conn.(interface{ SetLinger(int) error }); ok {
				_ = c.SetLinger(0)
			}
			_ = conn.Close()
		}
	}
	panic(v)
}

// Denial is why a data-plane request is refused.
type Denial struct {
	status int
	msg    string
	reason string // for metrics: missing_token, invalid_token, invalid_signature
	envd   bool   // answered as envd does ({"code", "message"})
}

// Write answers the refused request: as envd does for a signed URL (the
// SDKs and E2B's tests compare that body), else as E2B's edge does.
func (d *Denial) Write(w http.ResponseWriter, reqID, sandboxID string) {
	if d.envd {
		writeEnvdError(w, d.status, d.msg)
		return
	}
	proxyError(w, reqID, sandboxID, d.status, d.msg)
}

// checkAccess enforces the sandbox's tokens and returns nil when allowed.
// envd and the code interpreter need the envd access token (X-Access-Token)
// or the traffic token; /files also accepts a signed URL; /health is open.
// User ports are public unless the sandbox was created with
// allowPublicTraffic false: then they need the traffic token (403, as on
// E2B).
func (s *Server) checkAccess(r *http.Request, t target, sb *sandbox.Sandbox) *Denial {
	if t.port != envd.Port && t.port != envd.CodeInterpreterPort {
		if sb.Network.AllowPublicTraffic {
			return nil
		}
		const h = "e2b-traffic-access-token"
		v := r.Header.Get(h)
		switch {
		case v == "":
			return &Denial{status: http.StatusForbidden, msg: "Sandbox is secured with traffic access token. Token header '" + h + "' is missing", reason: "missing_token"}
		case subtle.ConstantTimeCompare([]byte(v), []byte(sb.AccessToken)) != 1:
			return &Denial{status: http.StatusForbidden, msg: "Sandbox is secured with traffic access token. Provided token in header '" + h + "' is invalid", reason: "invalid_token"}
		}
		return nil
	}
	if r.URL.Path == "/health" {
		return nil
	}
	for _, h := range []string{"X-Access-Token", "E2b-Traffic-Access-Token"} {
		if v := r.Header.Get(h); v != "" && subtle.ConstantTimeCompare([]byte(v), []byte(sb.AccessToken)) == 1 {
			return nil
		}
	}
	if r.Header.Get("X-Access-Token") != "" {
		// A wrong token is refused even beside a signature, as envd does.
		return &Denial{status: http.StatusUnauthorized, msg: "invalid access token", reason: "invalid_token"}
	}
	if t.port == envd.Port && r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" {
		if msg := checkSignature(r, sb.AccessToken); msg != "" {
			return &Denial{status: http.StatusUnauthorized, msg: msg, reason: "invalid_signature", envd: true}
		}
		return nil
	}
	return &Denial{status: http.StatusUnauthorized, msg: "missing access token: send the sandbox's envdAccessToken in X-Access-Token", reason: "missing_token"}
}

// CheckToken checks a data-plane request to an agent port (envd, the code
// interpreter) against a sandbox's token: a token header, or a signed
// /files URL. It returns nil when allowed, else the refusal to write.
// /health is open.
func CheckToken(r *http.Request, port int, token string) *Denial {
	if port != envd.Port && port != envd.CodeInterpreterPort {
		return nil // a user port: its sandbox decides (allowPublicTraffic)
	}
	return (&Server{}).checkAccess(r, target{port: port}, &sandbox.Sandbox{AccessToken: token, Network: sandbox.Network{AllowPublicTraffic: true}})
}
