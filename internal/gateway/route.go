package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/clusterauth"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/dashboard"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/ids"
	"github.com/cellfork/cellfork/internal/timing"
)

// headerForwarded marks a request one gateway forwarded to another region's
// (it is forwarded at most once).
const headerForwarded = "X-Cellfork-Forwarded-From"

// headerRegion names the region a create asks for.
const headerRegion = "X-Cellfork-Region"

// ServeHTTP routes a request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	api.ObserveTraced(g.log, g.cfg.Tracing, w, r, g.serve, g.observed(r))
}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, reqID string) {
	t0 := time.Now()
	clusterauth.Strip(r.Header) // internal headers never come from outside
	region := ""
	if rest, ok := strings.CutPrefix(r.URL.Path, "/r/"); ok {
		region, r.URL.Path, _ = strings.Cut(rest, "/")
		r.URL.Path = "/" + r.URL.Path
		r.URL.RawPath = ""
	}
	if v := r.Header.Get(headerRegion); v != "" {
		region = v
	}
	if g.view.Load() == nil {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "the gateway is starting"))
		return
	}
	if id, port, ok := api.DataPlaneTarget(r); ok {
		g.dataPlane(w, r, reqID, id, port, t0)
		return
	}
	switch r.URL.Path {
	case "/health":
		v := g.view.Load()
		var queries int64
		if db := g.db.Load(); db != nil {
			queries = db.Queries()
		}
		api.WriteJSON(w, http.StatusOK, map[string]any{"status": "ok", "region": v.Region.Name, "hosts": len(v.Hosts),
			"database": g.db.Load() != nil, "dbQueries": queries})
		return
	case "/openapi.yaml":
		api.ServeOpenAPI(w, r)
		return
	case "/dashboard":
		http.Redirect(w, r, "/dashboard/", http.StatusMovedPermanently)
		return
	}
	// The dashboard's static files need no key; the page calls the API
	// with the key its user signs in with.
	if strings.HasPrefix(r.URL.Path, "/dashboard/") && r.Method == http.MethodGet {
		http.StripPrefix("/dashboard", dashboard.Handler()).ServeHTTP(w, r)
		return
	}
	// Another region's sandbox: its gateway answers (it authenticates too).
	if id := sandboxInPath(r.URL.Path); id != "" {
		if s, err := ids.ParseSandbox(id); err == nil && s.Region != g.view.Load().Region.ID {
			g.toRegion(w, r, s.Region)
			return
		}
	}
	// E2B's SDKs PUT a template's files to the link its template host
	// signed, with no key (as to a presigned S3 URL): that host checks
	// the signature.
	if r.Method == http.MethodPut && signedUploadRE.MatchString(r.URL.Path) && r.URL.Query().Get("signature") != "" {
		g.templateOp(w, r, "")
		return
	}
	c, err := g.authenticate(r)
	if err != nil {
		var ae *authError
		if errors.As(err, &ae) {
			api.WriteError(w, reqID, http.StatusUnauthorized, ae.msg)
			return
		}
		api.Fail(g.log, w, r, err)
		return
	}
	timing.Since(r.Context(), "auth", t0)
	defer timing.Since(r.Context(), "route", t0)
	g.control(w, r, c, region)
}

// sandboxInPath returns the sandbox id of /sandboxes/{id}... and
// /v2/sandboxes/{id}... paths.
func sandboxInPath(p string) string {
	p = strings.TrimPrefix(p, "/v2")
	rest, ok := strings.CutPrefix(p, "/sandboxes/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}

// control routes a control-plane request.
func (g *Gateway) control(w http.ResponseWriter, r *http.Request, c caller, region string) {
	p := r.URL.Path
	switch {
	case (p == "/sandboxes" || p == "/v2/sandboxes") && r.Method == http.MethodPost:
		g.create(w, r, c, region)
	case (p == "/sandboxes" || p == "/v2/sandboxes") && r.Method == http.MethodGet:
		g.list(w, r, c)
	case p == "/snapshots" && r.Method == http.MethodGet:
		g.listSnapshots(w, r, c)
	case p == "/snapshots/usage" && r.Method == http.MethodGet:
		g.snapshotUsage(w, r, c)
	case strings.HasPrefix(p, "/snapshots/"):
		g.snapshotOp(w, r, c)
	case strings.HasPrefix(p, "/templates/") && r.Method == http.MethodDelete:
		g.deleteTemplate(w, r, c)
	case templateAPI(p):
		g.templateOp(w, r, c.team.ID)
	case p == "/hosts" && r.Method == http.MethodGet:
		g.hosts(w)
	case sandboxInPath(p) != "":
		g.sandboxOp(w, r, c)
	default:
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrNotFound, "no such endpoint: %s %s", r.Method, p))
	}
}

// hostOf returns the host a sandbox id lives on: the moved map, else the
// slot in the id. No database read.
func (g *Gateway) hostOf(id string) (clusterdb.Host, error) {
	s, err := ids.ParseSandbox(id)
	if err != nil {
		// An id that cannot exist: not found, as E2B answers, and never
		// sent to a host.
		return clusterdb.Host{}, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found: not a valid id (%v)", id, err)
	}
	slot := s.Slot
	if moved, ok := (*g.moved.Load())[id]; ok {
		slot = moved
	}
	h, ok := g.view.Load().table.Host(slot)
	if !ok {
		return h, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	return h, nil
}

// errHostLost is a lost host's sandbox's answer.
func errHostLost(id string, h clusterdb.Host) error {
	return errdefs.New(errdefs.ErrUnavailable, "sandbox %q is lost: its host (slot %d) stopped answering at %s", id, h.Slot, h.HeartbeatAt.UTC().Format(time.RFC3339))
}

// dataPlane routes a request into a sandbox: the id says which host; the
// token is checked here, with no lookup (it derives from the id); nothing
// reads the database.
func (g *Gateway) dataPlane(w http.ResponseWriter, r *http.Request, reqID, id string, port int, t0 time.Time) {
	s, err := ids.ParseSandbox(id)
	if err != nil {
		api.ProxyError(w, reqID, id, http.StatusBadGateway, fmt.Sprintf("The sandbox was not found: %q is not a valid id (%v)", id, err))
		return
	}
	if port < 1 || port > 65535 {
		api.ProxyError(w, reqID, id, http.StatusBadRequest, "invalid sandbox port")
		return
	}
	if s.Region != g.view.Load().Region.ID {
		g.toRegion(w, r, s.Region)
		return
	}
	h, err := g.hostOf(id)
	if err != nil {
		api.ProxyError(w, reqID, id, http.StatusBadGateway, "The sandbox was not found: "+errdefs.UserMessage(err))
		return
	}
	if h.State == "lost" {
		api.ProxyError(w, reqID, id, http.StatusBadGateway, "The sandbox was not found: "+errdefs.UserMessage(errHostLost(id, h)))
		return
	}
	if tokens := g.tokens.Load(); tokens != nil && r.URL.Path != "/health" {
		if d := api.CheckToken(r, port, tokens.Token(id)); d != nil && !g.checkOld(r, port, id, tokens) {
			d.Write(w, reqID, id)
			return
		}
	}
	timing.Since(r.Context(), "route", t0)
	g.forward(w, r, intoSandbox(h.Addr), nil)
}

// checkOld accepts a token derived under a previous key (rotation).
func (g *Gateway) checkOld(r *http.Request, port int, id string, tokens *ids.Tokens) bool {
	for _, h := range []string{"X-Access-Token", "E2b-Traffic-Access-Token"} {
		if v := r.Header.Get(h); v != "" && tokens.Check(id, v) {
			return true
		}
	}
	return false
}

// sandboxOp forwards an operation on one sandbox to its host, for the
// caller's team (the host answers 404 for another team's).
func (g *Gateway) sandboxOp(w http.ResponseWriter, r *http.Request, c caller) {
	if strings.HasSuffix(r.URL.Path, "/assume") { // a gateway's call to a host, never a client's
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path))
		return
	}
	id := sandboxInPath(r.URL.Path)
	h, err := g.hostOf(id)
	if err != nil {
		api.Fail(g.log, w, r, err)
		return
	}
	if isResume(r) && away(h) && g.resumeElsewhere(w, r, c, id, h) {
		return
	}
	if h.State == "lost" {
		g.lostOp(w, r, c, id, h)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/fork") && r.Method == http.MethodPost {
		g.fork(w, r, c, id, h)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/merge") && r.Method == http.MethodPost && g.mergeAcross(w, r, c, id, h) {
		return
	}
	g.forward(w, r, toHost(h.Addr, c.team.ID, ""), g.withDomain(r.Host))
}

// lostOp answers for a sandbox whose host is lost: its row says so (get,
// list), a kill forgets it, anything else is refused at once.
func (g *Gateway) lostOp(w http.ResponseWriter, r *http.Request, c caller, id string, h clusterdb.Host) {
	db := g.db.Load()
	if db == nil {
		api.Fail(g.log, w, r, errHostLost(id, h))
		return
	}
	row, err := db.GetSandbox(r.Context(), id)
	if err != nil || row.Team != c.team.ID {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id))
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/sandboxes/"+id:
		state := "lost" // a paused one stays paused: another host may resume it
		if row.State == "paused" {
			state = "paused"
		}
		api.WriteJSON(w, http.StatusOK, withState(row.Doc, state))
	case r.Method == http.MethodDelete && r.URL.Path == "/sandboxes/"+id:
		if _, err := db.ForgetLost(r.Context(), id, c.team.ID); err != nil {
			api.Fail(g.log, w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		api.Fail(g.log, w, r, errHostLost(id, h))
	}
}

// withState returns a listed sandbox's document with its state replaced.
func withState(doc json.RawMessage, state string) map[string]any {
	var m map[string]any
	_ = json.Unmarshal(doc, &m)
	if m == nil {
		m = map[string]any{}
	}
	m["state"] = state
	return m
}

// toRegion forwards a request once to a gateway of another region.
func (g *Gateway) toRegion(w http.ResponseWriter, r *http.Request, regionID int) {
	reqID := r.Header.Get("X-Request-Id")
	v := g.view.Load()
	reg, ok := v.byID[regionID]
	if !ok || reg.GatewayURL == "" {
		api.WriteError(w, reqID, http.StatusNotFound, fmt.Sprintf("region %d has no gateway in this cluster", regionID))
		return
	}
	if from := r.Header.Get(headerForwarded); from != "" {
		api.WriteError(w, reqID, http.StatusLoopDetected, fmt.Sprintf("forwarded from region %s and again: the region table is inconsistent", from))
		return
	}
	r.Header.Set(headerForwarded, v.Region.Name)
	h, err := toGateway(reg.GatewayURL)
	if err != nil {
		api.Fail(g.log, w, r, err)
		return
	}
	timing.Since(r.Context(), "route", time.Now())
	g.forward(w, r, h, nil)
}

// withDomain sets the domain in a sandbox answer to the region's (the SDK
// builds {port}-{id}.{domain} from it), or, when the region has none, to
// the address the client reached (host: the client request's Host), as a
// single host answers: never E2B's default domain.
func (g *Gateway) withDomain(host string) func(*http.Response) error {
	return func(resp *http.Response) error {
		if resp.StatusCode/100 != 2 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			return nil
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
		resp.Body.Close()
		if err != nil {
			return err
		}
		body = g.domainIn(body, host)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", fmt.Sprint(len(body)))
		return nil
	}
}

// domainIn sets the domain in a sandbox answer's body (withDomain).
func (g *Gateway) domainIn(body []byte, host string) []byte {
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return body
	}
	if _, ok := m["sandboxID"]; !ok {
		return body
	}
	if d := g.view.Load().Region.Domain; d != "" {
		m["domain"] = d
	} else if d := api.RequestDomain(host); d != "" {
		m["domain"] = d
	} else {
		m["domain"] = nil
	}
	if b, err := json.Marshal(m); err == nil {
		return b
	}
	return body
}

// hosts serves GET /hosts, the dashboard's view of the cluster: each
// host's slot, name, region, state and sandboxes, from memory. Addresses
// stay inside.
func (g *Gateway) hosts(w http.ResponseWriter) {
	v := g.view.Load()
	out := make([]map[string]any, 0, len(v.Hosts))
	for _, h := range v.Hosts {
		region := fmt.Sprint(h.Region)
		if reg, ok := v.byID[h.Region]; ok {
			region = reg.Name
		}
		state := h.State
		if state == "active" && h.Silent() {
			state = "unreachable"
		}
		out = append(out, map[string]any{"id": fmt.Sprintf("%d %s", h.Slot, h.Name), "slot": h.Slot, "region": region,
			"state": state, "sandboxes": h.Capacity.Sandboxes})
	}
	api.WriteJSON(w, http.StatusOK, out)
}
