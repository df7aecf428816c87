package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/api/apitypes"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

func (s *Server) routes() {
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		st := s.m.PoolStats()
		writeJSON(w, http.StatusOK, apitypes.Health{Status: apitypes.HealthStatusOk,
			Pool: apitypes.PoolStats{Ready: st.Ready, Shells: st.Shells, Standbys: st.Standbys}})
	})
	s.mux.HandleFunc("GET /openapi.yaml", serveOpenAPI)
	s.mux.HandleFunc("POST /v2/sandboxes", s.create)
	s.mux.HandleFunc("POST /sandboxes", s.create)
	s.mux.HandleFunc("GET /v2/sandboxes", s.list)
	s.mux.HandleFunc("GET /sandboxes", s.list)
	s.mux.HandleFunc("GET /sandboxes/{id}", s.get)
	s.mux.HandleFunc("DELETE /sandboxes/{id}", s.kill)
	s.mux.HandleFunc("POST /sandboxes/{id}/timeout", s.setTimeout)
	s.mux.HandleFunc("POST /sandboxes/{id}/refreshes", s.refresh)
	s.mux.HandleFunc("POST /v2/sandboxes/{id}/connect", s.connect)
	s.mux.HandleFunc("POST /sandboxes/{id}/connect", s.connect)
	s.mux.HandleFunc("GET /sandboxes/{id}/metrics", s.metrics)
	s.mux.HandleFunc("POST /sandboxes/{id}/pause", s.pause)
	s.mux.HandleFunc("POST /sandboxes/{id}/resume", s.resume)
	s.mux.HandleFunc("POST /sandboxes/{id}/snapshots", s.snapshot)
	s.mux.HandleFunc("GET /snapshots", s.listSnapshots)
	s.mux.HandleFunc("GET /snapshots/usage", s.snapshotUsage)
	s.mux.HandleFunc("GET /snapshots/tree", s.snapshotTree)
	s.mux.HandleFunc("GET /snapshots/{snapshotID}", s.getSnapshot)
	s.mux.HandleFunc("DELETE /snapshots/{snapshotID}", s.deleteSnapshot)
	s.mux.HandleFunc("DELETE /templates/{templateID}", s.deleteTemplate)
	s.mux.HandleFunc("POST /sandboxes/{id}/fork", s.fork)
	s.mux.HandleFunc("POST /sandboxes/{id}/rollback", s.rollback)
	s.mux.HandleFunc("POST /sandboxes/{id}/merge", s.merge)
	s.mux.HandleFunc("POST /sandboxes/{id}/assume", s.assume)
	s.mux.HandleFunc("PUT /sandboxes/{id}/network", s.updateNetwork)
	s.mux.HandleFunc("GET /sandboxes/{id}/network", s.getNetwork)
	s.opsRoutes()
	s.templateRoutes() // templates.go
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if allow := s.allowedMethods(r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, requestID(w), http.StatusMethodNotAllowed,
				fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", ")))
			return
		}
		writeError(w, requestID(w), http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
}

// allowedMethods lists the methods the routes serve on r's path; none for
// an unknown path.
func (s *Server) allowedMethods(r *http.Request) []string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := &http.Request{Method: m, URL: r.URL, Host: r.Host, Header: http.Header{}}
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	return allow
}

// maxControlBody bounds control-plane request bodies.
const maxControlBody = 1 << 20

// decode reads an optional JSON body into v. An empty body leaves v as is.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	_, err := decodeBody(w, r, v)
	return err
}

// decodeRequired reads the JSON body of an operation that needs one.
func decodeRequired(w http.ResponseWriter, r *http.Request, v any) error {
	present, err := decodeBody(w, r, v)
	if err == nil && !present {
		err = errdefs.New(errdefs.ErrInvalidArgument, "a JSON request body is required")
	}
	return err
}

// decodeBody reads a JSON body into v and reports whether there was one.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) (bool, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxControlBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return false, errdefs.New(errdefs.ErrInvalidArgument, "request body larger than %d bytes", maxControlBody)
		}
		return false, errdefs.New(errdefs.ErrInvalidArgument, "reading request body: %v", err)
	}
	switch strings.TrimSpace(string(body)) {
	case "":
		return false, nil
	case "null": // would decode to nothing, as if the body were {}
		return false, errdefs.New(errdefs.ErrInvalidArgument, "request body must be a JSON object, not null")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return false, errdefs.New(errdefs.ErrInvalidArgument, "malformed JSON body: %v", err)
	}
	return true, nil
}

// createLimits returns the limits a create asks for (zero: not asked). A
// limit given as zero or less is an error, not a request for the default.
func createLimits(b *apitypes.NewSandbox) (sandbox.Limits, error) {
	var l sandbox.Limits
	for _, f := range []struct {
		name string
		v    *int
	}{{"cpuCount", b.CPUCount}, {"memoryMB", b.MemoryMB}, {"diskSizeMB", b.DiskSizeMB}, {"pidsMax", b.PidsMax}, {"openFiles", b.OpenFiles}} {
		if f.v == nil {
			continue
		}
		if *f.v <= 0 {
			return l, errdefs.New(errdefs.ErrInvalidArgument, "%s must be a positive integer, not %d (leave it out for the default)", f.name, *f.v)
		}
		*l.Field(f.name) = *f.v
	}
	return l, nil
}

// onTimeout reads E2B's lifecycle: autoPause true = pause on timeout
// instead of kill.
func onTimeout(b *apitypes.NewSandbox) string {
	if b.AutoPause != nil && *b.AutoPause {
		return "pause"
	}
	return "kill"
}

const clientID = "cellfork"

func (s *Server) sandboxJSON(r *http.Request, sb *sandbox.Sandbox) apitypes.Sandbox {
	return apitypes.Sandbox{
		TemplateID: sb.TemplateID, SandboxID: sb.ID, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: sb.AccessToken, TrafficAccessToken: sb.AccessToken, Domain: s.domain(r),
		BootMode: bootMode(sb.BootMode),
	}
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var b apitypes.NewSandbox
	if err := decode(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	if b.TemplateID == "" {
		s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "templateID is required"))
		return
	}
	limits, err := createLimits(&b)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req := sandbox.CreateRequest{ID: mintOf(r.Context()), TemplateID: b.TemplateID, Metadata: stringMap(b.Metadata), Envs: stringMap(b.EnvVars),
		Limits: limits, OnTimeout: onTimeout(&b), AutoResume: b.AutoResume != nil && apitypes.Value(b.AutoResume.Enabled),
		AutoPauseFiles: b.AutoPauseMemory != nil && !*b.AutoPauseMemory}
	ctx := r.Context()
	if _, ok := sandbox.TeamOf(ctx); ok {
		// A gateway's fork child on another host than its parent's.
		req.ParentID = r.Header.Get(HeaderForkOf)
		ctx = withImagePeer(ctx, r, b.TemplateID)
	}
	if b.Network != nil || b.AllowInternetAccess != nil {
		n, err := networkPolicy(b.Network, b.AllowInternetAccess)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		req.Network = &n
	}
	if b.Timeout != nil {
		if *b.Timeout <= 0 {
			s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "timeout must be a positive number of seconds"))
			return
		}
		req.Timeout = time.Duration(*b.Timeout) * time.Second
	}
	sb, err := s.m.Create(ctx, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.created(sb)
	writeJSON(w, http.StatusCreated, s.sandboxJSON(r, sb))
}

// HeaderForkOf names the parent of a fork child a gateway creates on
// another host than the parent's (a cluster host heeds it from gateways
// only; gateways drop Cellfork-* headers from outside).
const HeaderForkOf = "Cellfork-Fork-Of"

// listedJSON is E2B's ListedSandbox.
func listedJSON(sb *sandbox.Sandbox) apitypes.ListedSandbox {
	return apitypes.ListedSandbox{
		TemplateID: sb.TemplateID, SandboxID: sb.ID, ClientID: clientID,
		StartedAt: sb.StartedAt, EndAt: sb.EndAt,
		CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskSizeMB,
		State: apitypes.ListedSandboxState(sb.State), EnvdVersion: EnvdVersion, Metadata: sb.Metadata,
		PidsMax: apitypes.Optional(sb.PidsMax), OpenFiles: apitypes.Optional(sb.OpenFiles),
		ParentSandboxID: apitypes.Optional(sb.ParentID), SnapshotID: apitypes.Optional(sb.BaseSnapshot),
	}
}

// detailJSON is E2B's SandboxDetail: a ListedSandbox plus tokens, domain,
// network and lifecycle, and (ours) where its state comes from.
func (s *Server) detailJSON(r *http.Request, sb *sandbox.Sandbox) apitypes.SandboxDetail {
	l := listedJSON(sb)
	return apitypes.SandboxDetail{
		TemplateID: l.TemplateID, SandboxID: l.SandboxID, ClientID: l.ClientID,
		StartedAt: l.StartedAt, EndAt: l.EndAt,
		CPUCount: l.CPUCount, MemoryMB: l.MemoryMB, DiskSizeMB: l.DiskSizeMB,
		State: apitypes.SandboxDetailState(l.State), EnvdVersion: l.EnvdVersion, Metadata: l.Metadata,
		PidsMax: l.PidsMax, OpenFiles: l.OpenFiles,
		EnvdAccessToken: sb.AccessToken, Domain: s.domain(r),
		AllowInternetAccess: sb.Network.AllowInternet, Network: networkJSON(sb.Network),
		Lifecycle: apitypes.SandboxLifecycle{AutoResume: sb.AutoResume,
			OnTimeout: apitypes.SandboxLifecycleOnTimeout(sb.OnTimeout)},
		ParentSandboxID: apitypes.Optional(sb.ParentID), SnapshotID: apitypes.Optional(sb.BaseSnapshot), BootMode: bootMode(sb.BootMode),
		PauseMode: pauseMode(sb),
	}
}

// pauseMode is E2B's SandboxPauseMode of a paused sandbox (absent while it
// runs). Records of older daemons say nothing: their pauses were full.
func pauseMode(sb *sandbox.Sandbox) *apitypes.SandboxDetailPauseMode {
	switch {
	case sb.State != sandbox.StatePaused:
		return nil
	case sb.PauseMode == sandbox.PauseFiles:
		return apitypes.Optional(apitypes.SandboxDetailPauseModeFilesystem)
	}
	return apitypes.Optional(apitypes.SandboxDetailPauseModeFull)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.detailJSON(r, sb))
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	if err := s.m.Kill(r.Context(), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var b apitypes.TimeoutRequest
	if err := decode(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	if b.Timeout == nil {
		s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "timeout is required"))
		return
	}
	if err := s.m.SetTimeout(r.Context(), r.PathValue("id"), time.Duration(*b.Timeout)*time.Second); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh is E2B's v1 keep-alive: extend the timeout by duration seconds
// from now (default 60).
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	var b apitypes.RefreshRequest
	if err := decode(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	d := 60
	if b.Duration != nil {
		d = *b.Duration
	}
	if err := s.m.ExtendTimeout(r.Context(), r.PathValue("id"), time.Duration(d)*time.Second); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect returns a running sandbox (200) or resumes a paused one (201).
// A timeout only ever extends the sandbox's life.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) { s.resumeSandbox(w, r, false) }

// resume is E2B's v1 resume: like connect, but 409 if the sandbox was
// running.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) { s.resumeSandbox(w, r, true) }

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request, mustBePaused bool) {
	var b apitypes.ConnectRequest
	if err := decode(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	var timeout time.Duration
	if b.Timeout != nil {
		if *b.Timeout < 0 {
			s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "timeout must not be negative"))
			return
		}
		timeout = time.Duration(*b.Timeout) * time.Second
	}
	// memory false: reboot from the files (E2B's on_resume="reboot").
	req := sandbox.ConnectRequest{Timeout: timeout, MustBePaused: mustBePaused, Reboot: b.Memory != nil && !*b.Memory}
	sb, resumed, err := s.m.Connect(r.Context(), id, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.sandboxJSON(r, sb))
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var bounds [2]time.Time
	for i, k := range []string{"start", "end"} {
		if q.Has(k) {
			n, err := strconv.ParseInt(q.Get(k), 10, 64)
			if err != nil || n < 0 {
				s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "%s must be Unix seconds", k))
				return
			}
			bounds[i] = time.Unix(n, 0)
		}
	}
	if !bounds[0].IsZero() && !bounds[1].IsZero() && bounds[1].Before(bounds[0]) {
		s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "end must not be before start"))
		return
	}
	ms, err := s.m.Metrics(r.Context(), r.PathValue("id"), bounds[0], bounds[1])
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]apitypes.SandboxMetric, 0, len(ms))
	for _, m := range ms {
		out = append(out, apitypes.SandboxMetric{
			Timestamp: m.At, TimestampUnix: m.At.Unix(),
			CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
			MemUsed: int64(m.MemUsed), MemTotal: int64(m.MemTotal), MemCache: int64(m.MemCache),
			DiskUsed: int64(m.DiskUsed), DiskTotal: int64(m.DiskTotal),
		})
	}
	writeJSON(w, http.StatusOK, out)
}

// list serves GET /v2/sandboxes (paged by X-Next-Token) and v1 GET /sandboxes.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := parseListFilter(q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var page []apitypes.ListedSandbox
	all, err := s.m.List(r.Context()) // sorted by (startedAt, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if f.desc {
		slices.Reverse(all)
	}
	next, last := "", (*sandbox.Sandbox)(nil)
	for _, sb := range all {
		if !f.match(sb) {
			continue
		}
		if len(page) == f.limit {
			next = pageToken(last)
			break
		}
		page, last = append(page, listedJSON(sb)), sb
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	if page == nil {
		page = []apitypes.ListedSandbox{}
	}
	writeJSON(w, http.StatusOK, page)
}

type listFilter struct {
	metadata map[string]string
	states   []string
	template string
	desc     bool
	after    string // sort key to continue after (from nextToken); "" = first page
	limit    int
	started  time.Time
}

// sortKey orders sandboxes as Manager.List does; page tokens carry the key
// of a page's last sandbox, so paging survives sandboxes coming and going.
func sortKey(sb *sandbox.Sandbox) string {
	return fmt.Sprintf("%020d:%s", sb.StartedAt.UnixNano(), sb.ID)
}

func pageToken(last *sandbox.Sandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(sortKey(last)))
}

func parseListFilter(q url.Values) (*listFilter, error) {
	// Newest first unless asked otherwise, as E2B's OrderDirection.
	f := &listFilter{states: []string{"running", "paused"}, limit: 100, template: q.Get("template"), desc: true}
	if v := q.Get("metadata"); v != "" {
		mq, err := url.ParseQuery(v)
		if err != nil {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "metadata filter must be URL-encoded k=v pairs")
		}
		// The E2B SDKs percent-encode each key and value before encoding
		// the pairs, so each is unescaped once more (as upstream does).
		f.metadata = map[string]string{}
		for k := range mq {
			key, err1 := url.QueryUnescape(k)
			val, err2 := url.QueryUnescape(mq.Get(k))
			if err1 != nil || err2 != nil {
				return nil, errdefs.New(errdefs.ErrInvalidArgument, "metadata filter: keys and values must be percent-encoded")
			}
			f.metadata[key] = val
		}
	}
	// A typed parameter given empty (?limit=) is invalid, not absent.
	if q.Has("state") {
		f.states = strings.Split(q.Get("state"), ",")
		for _, st := range f.states {
			if st != "running" && st != "paused" {
				return nil, errdefs.New(errdefs.ErrInvalidArgument, "state must be running and/or paused, not %q", st)
			}
		}
	}
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > 1000 {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "limit must be between 1 and 1000")
		}
		f.limit = n
	}
	if v := q.Get("nextToken"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid nextToken")
		}
		f.after = string(b)
		if _, _, ok := strings.Cut(f.after, ":"); !ok {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid nextToken")
		}
	}
	if q.Has("startedAfter") {
		t, err := time.Parse(time.RFC3339Nano, q.Get("startedAfter"))
		if err != nil {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "startedAfter must be an RFC 3339 time")
		}
		f.started = t
	}
	if q.Has("order") {
		switch q.Get("order") {
		case "asc":
			f.desc = false
		case "desc":
			f.desc = true
		default:
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "order must be asc or desc")
		}
	}
	return f, nil
}

// match reports whether sb passes the filter and comes after the page token.
func (f *listFilter) match(sb *sandbox.Sandbox) bool {
	if k := sortKey(sb); f.after != "" && (!f.desc && k <= f.after || f.desc && k >= f.after) {
		return false
	}
	if !slices.Contains(f.states, string(sb.State)) || (f.template != "" && sb.TemplateID != f.template) {
		return false
	}
	if !f.started.IsZero() && !sb.StartedAt.After(f.started) {
		return false
	}
	for k, v := range f.metadata {
		if sb.Metadata[k] != v {
			return false
		}
	}
	return true
}

// ListedDoc is a sandbox as a list shows it (E2B's ListedSandbox): what a
// cluster host writes into its row, so that a gateway lists without
// asking hosts.
func ListedDoc(sb *sandbox.Sandbox) json.RawMessage {
	b, _ := json.Marshal(listedJSON(sb))
	return b
}

// SnapshotDoc is a snapshot as the API shows it.
func SnapshotDoc(sn *sandbox.Snapshot) json.RawMessage {
	b, _ := json.Marshal(snapshotJSON(sn))
	return b
}

// ListQuery is a sandbox list's query (GET /v2/sandboxes), parsed and
// checked as this API does: the gateway lists from the cluster database
// with it.
type ListQuery struct {
	Metadata     map[string]string
	States       []string
	Template     string
	Desc         bool
	AfterStarted time.Time // the page token's sandbox (zero: first page)
	AfterID      string
	Limit        int
	StartedAfter time.Time
}

// ParseList parses a list's query string.
func ParseList(q url.Values) (ListQuery, error) {
	f, err := parseListFilter(q)
	if err != nil {
		return ListQuery{}, err
	}
	lq := ListQuery{Metadata: f.metadata, States: f.states, Template: f.template, Desc: f.desc, Limit: f.limit, StartedAfter: f.started}
	if f.after != "" {
		ns, id, _ := strings.Cut(f.after, ":")
		n, err := strconv.ParseInt(ns, 10, 64)
		if err != nil {
			return ListQuery{}, errdefs.New(errdefs.ErrInvalidArgument, "invalid nextToken")
		}
		lq.AfterStarted, lq.AfterID = time.Unix(0, n), id
	}
	return lq, nil
}

// PageToken is the nextToken continuing after a sandbox.
func PageToken(started time.Time, id string) string {
	return pageToken(&sandbox.Sandbox{StartedAt: started, ID: id})
}
