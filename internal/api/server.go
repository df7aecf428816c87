// Package api serves cellfork's HTTP surface on one port: the E2B-compatible
// control plane (plus our extensions) and the sandbox data plane, which it
// proxies to the agent or to a user's port inside the sandbox. Errors are
// mapped to HTTP statuses here and nowhere else.
package api

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/api/apitypes"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/metrics"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/telemetry"
	"github.com/cellfork/cellfork/internal/timing"
)

// EnvdVersion is the envd version we report; the SDKs gate features on it
// (spec §3) and we implement everything up to it.
const EnvdVersion = "0.6.13"

// Config configures the HTTP layer.
type Config struct {
	APIKeys        []string
	Domain         string // sandbox domain reported to SDKs; "" = null
	MaxUploadBytes int64
	// Auth decides who a request comes from; nil: the API keys above (a
	// single host).
	Auth Authenticator
	// Metrics counts requests and serves GET /metrics (behind the API
	// key); nil: neither. Host serves GET /host (the host's levels).
	Metrics *metrics.Host
	Host    metrics.Source
	// Tracing makes a span of every request and its phases; nil: off.
	Tracing *telemetry.Tracing
	// Templates serves E2B's template API (nil: none, 404).
	Templates Templates
	// BuiltinLimits are the built-in templates' sandbox defaults, as
	// template listings report them.
	BuiltinLimits map[string]sandbox.Limits
}

// Authenticator decides who a request comes from.
type Authenticator interface {
	// Control authenticates a control-plane request: it returns the
	// context the request runs in (scoped to its team, see
	// sandbox.WithTeam; with the id a create is to take, see WithMint),
	// or a message for a 401.
	Control(r *http.Request) (context.Context, string)
	// DataPlane vets where a data-plane request comes from: "" to go on
	// (the sandbox's tokens are checked after), or a message for a 401.
	DataPlane(r *http.Request) string
}

type mintKey struct{}

// WithMint says the create in ctx is to take id (minted by the gateway
// that placed it).
func WithMint(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, mintKey{}, id)
}

func mintOf(ctx context.Context) string {
	id, _ := ctx.Value(mintKey{}).(string)
	return id
}

// keyAuth is a single host's: one of its API keys in X-API-KEY.
type keyAuth struct{ keys []string }

func (a keyAuth) Control(r *http.Request) (context.Context, string) {
	key := r.Header.Get("X-API-KEY")
	if key == "" {
		return nil, "missing API key: send it in the X-API-KEY header"
	}
	for _, k := range a.keys {
		if subtle.ConstantTimeCompare([]byte(k), []byte(key)) == 1 {
			return r.Context(), ""
		}
	}
	return nil, "invalid API key"
}

func (keyAuth) DataPlane(*http.Request) string { return "" }

// Server is the daemon's http.Handler. Safe for concurrent use.
type Server struct {
	cfg Config
	m   Backend
	log *slog.Logger
	mux *http.ServeMux
	// uploadKey signs template upload links (templates.go).
	uploadKey []byte
}

// New returns the handler.
func New(cfg Config, m Backend, log *slog.Logger) *Server {
	if cfg.Auth == nil {
		cfg.Auth = keyAuth{cfg.APIKeys}
	}
	s := &Server{cfg: cfg, m: m, log: log, mux: http.NewServeMux(), uploadKey: newUploadKey()}
	s.routes()
	return s
}

type ctxKey int

const requestIDKey ctxKey = 0

// ServeHTTP assigns a request id, records phases into Server-Timing (and
// metrics and spans), and dispatches to the data plane or the control
// plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, dataPlane := dataPlaneTarget(r)
	defer s.inFlight(dataPlane)()
	routed := r // the request the mux saw (its pattern and path values)
	serve := func(w http.ResponseWriter, r *http.Request, id string) {
		routed = r
		if dataPlane {
			if msg := s.cfg.Auth.DataPlane(r); msg != "" {
				proxyError(w, id, t.sandboxID, http.StatusUnauthorized, msg)
			} else {
				s.proxy(w, r, t, id)
			}
		} else if signedFilesURL(r) {
			if msg := s.cfg.Auth.DataPlane(r); msg != "" {
				proxyError(w, id, "", http.StatusUnauthorized, msg)
			} else {
				s.signedFiles(w, r, id)
			}
		} else if r, ok := s.authorized(w, r, id); ok {
			routed = r
			s.mux.ServeHTTP(w, r)
		}
	}
	ObserveTraced(s.log, s.cfg.Tracing, w, r, serve, func(status int, rec *timing.Recorder, span *telemetry.Request, total time.Duration) {
		s.observe(routed, t, dataPlane, status, rec, span, total)
	})
}

// Observe serves a request through serve with a request id (X-Request-Id
// on the response, and on the request for handlers that log; never
// forwarded as trust) and the phases recorded into Server-Timing, and logs
// it. The gateway serves through it too.
func Observe(log *slog.Logger, w http.ResponseWriter, r *http.Request, serve func(w http.ResponseWriter, r *http.Request, reqID string)) {
	ObserveTraced(log, nil, w, r, serve, nil)
}

// ObserveTraced is Observe that also makes a span of the request (and of
// each phase) when tracing is on, and then calls done (nil: none) with
// the outcome, for metrics; done ends the span (telemetry.Request.Finish),
// else the span is ended unnamed.
func ObserveTraced(log *slog.Logger, tracing *telemetry.Tracing, w http.ResponseWriter, r *http.Request,
	serve func(w http.ResponseWriter, r *http.Request, reqID string),
	done func(status int, rec *timing.Recorder, span *telemetry.Request, total time.Duration)) {
	start := time.Now()
	ctx, span := tracing.StartRequest(r)
	ctx, rec := timing.WithTracer(ctx, tracing.Phases())
	id := newRequestID()
	tw := &timedWriter{ResponseWriter: w, rec: rec, start: start}
	tw.Header().Set("X-Request-Id", id)
	r = r.WithContext(ctx)
	r.Header.Set("X-Request-Id", id)
	serve(tw, r, id)
	if !tw.wrote {
		tw.WriteHeader(http.StatusOK)
	}
	total := time.Since(start)
	if done != nil {
		done(tw.status, rec, span, total)
	} else {
		span.Finish("", "", "", tw.status)
	}
	log.Debug("request", "request.id", id, "method", r.Method, "path", r.URL.Path,
		"status", tw.status, "ms", float64(total.Microseconds())/1000)
}

// WriteError answers with the E2B error shape.
func WriteError(w http.ResponseWriter, reqID string, status int, msg string) {
	writeError(w, reqID, status, msg)
}

// Fail answers with err's class and caller-facing message (Retry-After on
// a 503); internal detail goes to log only.
func Fail(log *slog.Logger, w http.ResponseWriter, r *http.Request, err error) {
	(&Server{log: log}).fail(w, r, err)
}

// ProxyError answers a data-plane request the way the SDKs understand.
func ProxyError(w http.ResponseWriter, reqID, sandboxID string, status int, msg string) {
	proxyError(w, reqID, sandboxID, status, msg)
}

// DataPlaneTarget finds the sandbox and port a data-plane request is for
// (E2B's routing headers, or the Host {port}-{id}.{domain}).
func DataPlaneTarget(r *http.Request) (sandboxID string, port int, ok bool) {
	t, ok := dataPlaneTarget(r)
	return t.sandboxID, t.port, ok
}

func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// timedWriter adds Server-Timing when the header is written (merging any
// Server-Timing a proxied upstream sent).
type timedWriter struct {
	http.ResponseWriter
	rec    *timing.Recorder
	start  time.Time
	wrote  bool
	status int
}

func (w *timedWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote, w.status = true, code
	v := w.rec.Header(time.Since(w.start))
	if up := w.Header().Get("Server-Timing"); up != "" {
		v = up + ", " + v
	}
	w.Header().Set("Server-Timing", v)
	w.ResponseWriter.WriteHeader(code)
}

func (w *timedWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Flush lets streamed responses through.
func (w *timedWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection (deadlines,
// full duplex).
func (w *timedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands the connection over (WebSocket upgrades through the proxy);
// the hijacker writes the status line itself.
func (w *timedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.wrote, w.status = true, http.StatusSwitchingProtocols
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// authorized authenticates a control-plane request and returns it in the
// context it runs in. GET /metrics also takes the key as "Authorization:
// Bearer KEY" (what Prometheus's scrape configuration sends). The
// dashboard's static files are public: the page asks for a key and sends
// it with every API call.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request, reqID string) (*http.Request, bool) {
	if r.URL.Path == "/health" || r.URL.Path == "/openapi.yaml" || isDashboard(r.URL.Path) {
		return r, true
	}
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && r.URL.Path == "/metrics" && r.Header.Get("X-API-KEY") == "" {
		r.Header.Set("X-API-KEY", bearer)
	}
	if s.signedUpload(r) { // a template upload link carries its own signature
		return r, true
	}
	ctx, msg := s.cfg.Auth.Control(r)
	if msg != "" {
		if r.Header.Get("X-API-KEY") == "" {
			s.authFailed("missing_key")
		} else {
			s.authFailed("invalid_key")
		}
		writeError(w, reqID, http.StatusUnauthorized, msg)
		return r, false
	}
	return r.WithContext(ctx), true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, reqID string, status int, msg string) {
	if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		w.Header().Set("Should-Retry", "false")
	}
	// E2B's error shape (code = HTTP status) plus our request id.
	writeJSON(w, status, apitypes.Error{Code: status, Message: msg, RequestID: apitypes.Optional(reqID)})
}

// statusOf maps an error class to its HTTP status: the one place that does.
func statusOf(err error) int {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusInsufficientStorage
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden
	case errors.Is(err, errdefs.ErrLimitReached):
		return http.StatusTooManyRequests
	case errors.Is(err, errdefs.ErrCorrupt):
		// Stored bytes failed their check (a snapshot's image in the chunk
		// store): the server's data, not the request, is at fault.
		return http.StatusInternalServerError
	}
	return http.StatusInternalServerError
}

// errorOf returns err's status and caller-facing message; internal detail
// goes only to the log, under the request id.
func (s *Server) errorOf(r *http.Request, err error) (int, string) {
	status := statusOf(err)
	msg := errdefs.UserMessage(err)
	reqID := r.Header.Get("X-Request-Id")
	if msg == "" {
		msg = "internal error (request " + reqID + ")"
	}
	if status >= 500 {
		s.log.Error("request failed", "request.id", reqID, "path", r.URL.Path, "err", err)
	}
	return status, msg
}

// fail answers with err's class and caller-facing message.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, msg := s.errorOf(r, err)
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeError(w, requestID(w), status, msg)
}

func requestID(w http.ResponseWriter) string { return w.Header().Get("X-Request-Id") }

// WriteJSON answers with v as JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v) }
