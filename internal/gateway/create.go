package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/clusterauth"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/ids"
	"github.com/cellfork/cellfork/internal/placement"
	"github.com/cellfork/cellfork/internal/template"
	"github.com/cellfork/cellfork/internal/timing"
)

// maxCreateTries bounds the hosts a create is tried on when they fail
// (capacity conflicts with other gateways are not counted).
const maxCreateTries = 3

// create places a new sandbox: region (asked, the team's default, or this
// gateway's) within the caller's policy; a host chosen in memory; its
// memory and the sandbox's row reserved in one transaction (the team's
// bound enforced there); an id minted with the host's slot; the create
// sent to the host. A host that fails gives its reservation back and the
// next is tried; a region that cannot take it fails over to another
// allowed one, unless the region was asked for.
func (g *Gateway) create(w http.ResponseWriter, r *http.Request, c caller, asked string) {
	t0 := time.Now()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrInvalidArgument, "reading request body: %v", err))
		return
	}
	var b struct {
		TemplateID *string `json:"templateID"`
		MemoryMB   *int64  `json:"memoryMB"`
	}
	if len(bytes.TrimSpace(body)) > 0 {
		if err := json.Unmarshal(body, &b); err != nil {
			api.Fail(g.log, w, r, errdefs.New(errdefs.ErrInvalidArgument, "malformed JSON body: %v", err))
			return
		}
	}
	v := g.view.Load()
	region := v.Region
	pinned := asked != ""
	switch {
	case pinned:
		reg, ok := v.byName[asked]
		if !ok {
			api.Fail(g.log, w, r, errdefs.New(errdefs.ErrInvalidArgument, "no region %q in this cluster", asked))
			return
		}
		region = reg
	case c.team.DefaultRegion != "":
		if reg, ok := v.byName[c.team.DefaultRegion]; ok {
			region = reg
		}
	}
	if !c.allows(region) {
		if pinned || !g.anyAllowed(c) {
			api.Fail(g.log, w, r, errdefs.New(errdefs.ErrPermissionDenied, "region %s is not allowed by the location policy (%s)", region.Name, c.policy()))
			return
		}
		region = g.firstAllowed(c)
	}
	// The region chosen first; unless it was asked for, the other allowed
	// ones after it (this gateway's own region first among them), each
	// tried when the one before cannot take the create: no host fits, its
	// gateway is unreachable or answers 5xx. A forwarded create is not
	// passed on again.
	order := []clusterdb.Region{region}
	if !pinned && r.Header.Get(headerForwarded) == "" {
		for _, other := range append([]clusterdb.Region{v.Region}, v.Regions...) {
			if c.allows(other) && !slices.ContainsFunc(order, func(o clusterdb.Region) bool { return o.ID == other.ID }) &&
				(other.ID == v.Region.ID || other.GatewayURL != "") {
				order = append(order, other)
			}
		}
	}
	for i, reg := range order {
		last := i == len(order)-1
		if reg.ID != v.Region.ID {
			r.Body = io.NopCloser(bytes.NewReader(body))
			if g.createIn(w, r, reg, last) {
				return
			}
			continue
		}
		if g.createHere(w, r, c, reg, b.TemplateID, b.MemoryMB, body, last, t0) {
			return
		}
	}
}

// createIn forwards a create to region reg's gateway. It answers the
// client and returns true, unless reg failed in a way another region may
// not (unreachable, 5xx) and last is false: then it answers nothing.
func (g *Gateway) createIn(w http.ResponseWriter, r *http.Request, reg clusterdb.Region, last bool) bool {
	if last {
		g.toRegion(w, r, reg.ID)
		return true
	}
	rec := &failoverWriter{ResponseWriter: w}
	g.toRegion(rec, r, reg.ID)
	if rec.failed {
		g.log.Info("create failing over to another region", "from", reg.Name, "status", rec.status)
		return false
	}
	return true
}

// failoverWriter passes an answer through unless it is a 5xx, which it
// drops (headers, status and body) so that the create can go elsewhere.
type failoverWriter struct {
	http.ResponseWriter
	header http.Header
	status int
	failed bool
}

func (f *failoverWriter) Header() http.Header {
	if f.header == nil {
		f.header = http.Header{}
	}
	return f.header
}

func (f *failoverWriter) WriteHeader(status int) {
	f.status = status
	if status >= 500 {
		f.failed = true
		return
	}
	for k, v := range f.header {
		f.ResponseWriter.Header()[k] = v
	}
	f.ResponseWriter.WriteHeader(status)
}

func (f *failoverWriter) Write(b []byte) (int, error) {
	if f.failed {
		return len(b), nil
	}
	if f.status == 0 {
		f.WriteHeader(http.StatusOK)
	}
	return f.ResponseWriter.Write(b)
}

func (f *failoverWriter) Flush() {
	if !f.failed {
		http.NewResponseController(f.ResponseWriter).Flush()
	}
}

func (f *failoverWriter) Unwrap() http.ResponseWriter { return f.ResponseWriter }

// createHere places the create in this gateway's region. It answers the
// client and returns true, unless no host could take it and last is
// false: then it answers nothing.
func (g *Gateway) createHere(w http.ResponseWriter, r *http.Request, c caller, region clusterdb.Region, templateID *string, memoryMB *int64, body []byte, last bool, t0 time.Time) bool {
	req := placement.Request{Region: region.ID, MemoryMB: g.cfg.DefaultMemoryMB}
	if memoryMB != nil && *memoryMB > 0 {
		req.MemoryMB = *memoryMB
	}
	tpl := ""
	if templateID != nil {
		tpl = *templateID
	}
	if name, err := template.Resolve(tpl); err == nil {
		req.Template = name
	} else if tpl != "" {
		db := g.db.Load()
		if db == nil {
			api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later"))
			return true
		}
		sn, err := db.FindSnapshot(r.Context(), c.team.ID, tpl)
		switch {
		case err == nil:
			// Its image is on its host's disk, and, once uploaded, in the
			// chunk store: then any host of the build that wrote it can
			// take it, its own first.
			req.Standby = sn.ID
			if sn.StoreRoot != "" && sn.Region == region.ID {
				req.Home, req.Versions = sn.HostSlot, []string{"runsc=" + sn.Runtime}
			} else {
				req.Slot = sn.HostSlot
			}
		case errors.Is(err, errdefs.ErrNotFound):
			// A custom template: published to the chunk store, any host
			// of the runsc build that made its warm image pulls it.
			name, tag, _ := strings.Cut(tpl, ":")
			tb, terr := db.FindTemplateBuild(r.Context(), c.team.ID, name, tag)
			if terr != nil {
				if errors.Is(terr, errdefs.ErrNotFound) {
					terr = errdefs.New(errdefs.ErrNotFound, "template or snapshot %q not found (built-in templates: base, code-interpreter-v1)", tpl)
				}
				api.Fail(g.log, w, r, terr)
				return true
			}
			req.Template, req.Versions = tb.BuildID, []string{"runsc=" + tb.Runtime}
		default:
			api.Fail(g.log, w, r, err)
			return true
		}
	}
	timing.Since(r.Context(), "route", t0)
	reasons, err := g.place(w, r, c, req, body)
	if err == nil {
		return true // answered
	}
	if !last && (errors.Is(err, errNoHost) || errors.Is(err, errdefs.ErrUnavailable)) {
		g.log.Info("create failing over to another region", "from", region.Name, "why", err)
		return false
	}
	if errors.Is(err, errNoHost) {
		msg := fmt.Sprintf("no host in region %s can take the sandbox: %s", region.Name, reasons)
		if reasons.Capacity() {
			api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "%s; retry later", msg))
			return true
		}
		w.Header().Set("Should-Retry", "false")
		api.WriteError(w, r.Header.Get("X-Request-Id"), http.StatusServiceUnavailable, msg)
		return true
	}
	api.Fail(g.log, w, r, err)
	return true
}

var errNoHost = errors.New("no host can take it")

func (g *Gateway) anyAllowed(c caller) bool { return g.firstAllowed(c).Name != "" }

func (g *Gateway) firstAllowed(c caller) clusterdb.Region {
	for _, reg := range g.view.Load().Regions {
		if c.allows(reg) && reg.GatewayURL != "" {
			return reg
		}
	}
	return clusterdb.Region{}
}

// place tries hosts until one creates the sandbox and answers the client
// (err nil); it returns errNoHost (with why) when none can, or an error
// that ends the create (answered by the caller).
func (g *Gateway) place(w http.ResponseWriter, r *http.Request, c caller, req placement.Request, body []byte) (placement.Reasons, error) {
	db := g.db.Load()
	if db == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable: creates wait for it; retry later")
	}
	if c.max > 0 && c.team.Running >= c.max {
		return nil, errTeam(c, c.max)
	}
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	if req.Exclude == nil {
		req.Exclude = map[int]bool{}
	}
	for tries := 0; tries < maxCreateTries; {
		t0 := time.Now()
		cands, reasons := g.view.Load().table.Choose(req, rng)
		timing.Since(r.Context(), "place", t0)
		if len(cands) == 0 {
			return reasons, errNoHost
		}
		for _, h := range cands {
			id := ids.NewSandbox(req.Region, h.Slot)
			now := time.Now().UTC()
			row := clusterdb.Sandbox{ID: id, Team: c.team.ID, Region: req.Region, HostSlot: h.Slot, MemoryMB: int(req.MemoryMB),
				TemplateID: req.Template, StartedAt: now, EndAt: now}
			t1 := time.Now()
			err := db.Reserve(r.Context(), row, placement.Reserve)
			timing.Since(r.Context(), "reserve", t1)
			switch {
			case errors.Is(err, clusterdb.ErrNoCapacity):
				req.Exclude[h.Slot] = true // another gateway took it first
				continue
			case errors.Is(err, clusterdb.ErrTeamLimit):
				return nil, errTeam(c, c.team.MaxSandboxes)
			case errors.Is(err, clusterdb.ErrNoTeam):
				return nil, errdefs.New(errdefs.ErrNotFound, "team %q does not exist", c.team.ID)
			case err != nil:
				return nil, err
			}
			answered, created := g.createOn(w, r, h, c.team.ID, id, body)
			if !created {
				// Refused (4xx: the answer stands) or failed (the next
				// host is tried): the reservation goes either way.
				_ = db.Release(context.WithoutCancel(r.Context()), id, h.Slot, int(req.MemoryMB))
			}
			if answered {
				return nil, nil
			}
			req.Exclude[h.Slot] = true
			tries++
			break
		}
	}
	return placement.Reasons{"failed the create": maxCreateTries}, errNoHost
}

// errTeam is a team at its bound: 429, as E2B's concurrency limit.
func errTeam(c caller, max int) error {
	return errdefs.New(errdefs.ErrLimitReached, "team %s is at its limit of %d running sandboxes; kill or pause some, or ask for more", c.team.ID, max)
}

// createOn sends the create to host h under id. It answers the client
// (answered), unless the host failed in a way another host may not
// (transport error, 5xx): then it answers nothing. created says whether
// the host made the sandbox (a 4xx answers the client and makes none).
func (g *Gateway) createOn(w http.ResponseWriter, r *http.Request, h clusterdb.Host, team, id string, body []byte) (answered, created bool) {
	out, err := clusterauth.NewRequest(r.Context(), g.secrets.Load().Internal, team, id, http.MethodPost, "http://"+h.Addr+r.URL.Path, body)
	if err != nil {
		return false, false
	}
	for _, k := range []string{api.HeaderForkOf, api.HeaderImagePeer, api.HeaderImageRoot} {
		if v := r.Header.Get(k); v != "" { // set by forkElsewhere only: Cellfork-* from outside is stripped
			out.Header.Set(k, v)
		}
	}
	resp, err := g.hostCall(out)
	if err != nil {
		g.log.Warn("create failed on a host; trying another", "slot", h.Slot, "err", err)
		return false, false
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		g.log.Warn("create failed on a host; trying another", "slot", h.Slot, "status", resp.StatusCode, "body", strings.TrimSpace(string(msg)))
		return false, false
	}
	if st := resp.Header.Get("Server-Timing"); st != "" {
		w.Header().Set("Server-Timing", st)
	}
	_ = g.withDomain(r.Host)(resp)
	for _, k := range []string{"Content-Type", "Content-Length"} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
	return true, resp.StatusCode/100 == 2
}

// hostCall sends a request the gateway made itself to a host, as the
// request's "host" phase (until the answer's headers); with tracing on,
// the host's request span continues that phase's.
func (g *Gateway) hostCall(out *http.Request) (*http.Response, error) {
	ctx, end := timing.Start(out.Context(), "host")
	defer end()
	timing.Inject(ctx, out.Header)
	return g.toHosts.RoundTrip(out)
}

// roundTripper adapts a function to http.RoundTripper.
type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// callHost sends a signed call for team to host h (as hostCall) and
// returns its answer.
func (g *Gateway) callHost(ctx context.Context, h clusterdb.Host, team, method, path string, body []byte) (int, []byte, error) {
	return clusterauth.Call(ctx, roundTripper(g.hostCall), g.secrets.Load().Internal, team, method, "http://"+h.Addr+path, body)
}

// fork forwards a fork to the parent's host for as many children as it
// has room for, and makes the others on other hosts (forkElsewhere).
func (g *Gateway) fork(w http.ResponseWriter, r *http.Request, c caller, id string, h clusterdb.Host) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrInvalidArgument, "reading request body: %v", err))
		return
	}
	var b map[string]any
	n := 1
	if len(bytes.TrimSpace(body)) > 0 {
		if err := json.Unmarshal(body, &b); err != nil {
			api.Fail(g.log, w, r, errdefs.New(errdefs.ErrInvalidArgument, "malformed JSON body: %v", err))
			return
		}
		if cnt, ok := b["count"].(float64); ok {
			n = int(cnt)
		}
	}
	mem := g.cfg.DefaultMemoryMB
	if db := g.db.Load(); db != nil {
		if row, err := db.GetSandbox(r.Context(), id); err == nil && row.MemoryMB > 0 {
			mem = int64(row.MemoryMB)
		}
	}
	room := int((h.MemTotalMB - placement.Reserve - h.MemAllocMB) / max(mem, 1))
	if n < 1 || room >= n {
		r.Body = io.NopCloser(bytes.NewReader(body))
		g.forward(w, r, toHost(h.Addr, c.team.ID, ""), nil)
		return
	}
	if n > maxForkElsewhere {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrInvalidArgument, "count must be at most %d for a fork beyond the parent's host (it has room for %d)", maxForkElsewhere, max(room, 0)))
		return
	}
	results := []any{}
	if room > 0 {
		b["count"] = room
		nb, _ := json.Marshal(b)
		status, body, err := g.callHost(r.Context(), h, c.team.ID, http.MethodPost, r.URL.Path, nb)
		if err != nil {
			api.WriteError(w, r.Header.Get("X-Request-Id"), http.StatusBadGateway, "the parent's host does not answer; retry later")
			return
		}
		if status != http.StatusCreated {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write(body)
			return
		}
		_ = json.Unmarshal(body, &results)
	}
	more, refused := g.forkElsewhere(r, c, id, h, n-max(room, 0), mem, b["timeout"])
	if refused != nil && len(results) == 0 {
		// Nothing forked: the parent's host's answer (a paused parent's
		// 409, say) is the fork's.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(refused.status)
		_, _ = w.Write(refused.body)
		return
	}
	results = append(results, more...)
	w.Header().Set("Content-Length", strconv.Itoa(len(mustJSON(results))))
	api.WriteJSON(w, http.StatusCreated, results)
}

// maxForkElsewhere bounds a fork that overflows its parent's host (the
// hosts' default --max-fork; each host checks its own bound on its part).
const maxForkElsewhere = 64

// forkElsewhere makes k children of sandbox id on hosts other than its own,
// h, which has no room for them: a snapshot of the parent, taken on h and
// offered by h to the other hosts (its image's manifest computed there,
// Server-Timing "manifest"), and each child created from it on another
// host of the region as a create is placed ("peer"): that host imports
// the image from h, and from the chunk store what h does not give. The
// snapshot's upload to the store goes on meanwhile, unwaited; a host that
// cannot offer (an older cellfork) is waited for until the upload is done
// ("export"), and the children import from the store. The snapshot is
// deleted once they run (they keep what they mapped). The children are
// fork children of the parent (their hosts are told, HeaderForkOf). It
// returns an entry per child, a sandbox or an error, as a fork answers;
// and, when the parent's host refused the snapshot with a 4xx, that
// answer.
func (g *Gateway) forkElsewhere(r *http.Request, c caller, id string, h clusterdb.Host, k int, mem int64, timeout any) ([]any, *hostAnswer) {
	entries := func(code int, format string, args ...any) []any {
		e := forkError(code, format, args...)
		out := make([]any, k)
		for i := range out {
			out[i] = e
		}
		return out
	}
	call := func(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
		return g.callHost(ctx, h, c.team.ID, method, path, body)
	}
	t0 := time.Now()
	status, body, err := call(r.Context(), http.MethodPost, "/sandboxes/"+id+"/snapshots", []byte("{}"))
	if err == nil && status/100 == 4 {
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(body, &e)
		return entries(status, "%s", e.Message), &hostAnswer{status, body}
	}
	if err != nil || status != http.StatusCreated {
		return entries(http.StatusBadGateway, "the parent's host has no room for this child, and taking the parent's state to another host failed: %d %s %v", status, bytes.TrimSpace(body), err), nil
	}
	var sn struct {
		ID string `json:"snapshotID"`
	}
	_ = json.Unmarshal(body, &sn)
	timing.Since(r.Context(), "snapshot", t0)
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
		defer cancel()
		if status, body, err := call(ctx, http.MethodDelete, "/snapshots/"+sn.ID, nil); err != nil || status/100 != 2 {
			g.log.Warn("deleting a fork's transfer snapshot", "snapshot.id", sn.ID, "status", status, "body", string(body), "err", err)
		}
	}()
	db := g.db.Load()
	if db == nil {
		return entries(http.StatusServiceUnavailable, "the cluster database is unavailable; retry later"), nil
	}
	t1 := time.Now()
	root, err := g.offer(r.Context(), h, c.team.ID, sn.ID)
	timing.Since(r.Context(), "manifest", t1)
	if err != nil {
		g.log.Warn("the parent's host did not offer its snapshot's image; its children wait for its upload", "snapshot.id", sn.ID, "slot", h.Slot, "err", err)
	}
	row, err := g.awaitSnapshot(r.Context(), db, c.team.ID, sn.ID, root == "")
	if err != nil {
		return entries(http.StatusServiceUnavailable, "%s", err), nil
	}
	t3 := time.Now()
	out := g.children(r, c, id, h, k, row, mem, timeout, root)
	if root != "" {
		timing.Since(r.Context(), "peer", t3)
	}
	return out, nil
}

// awaitSnapshot waits (up to a minute) for the row of team's snapshot id,
// and with uploaded, for its upload to the chunk store (phase "export").
func (g *Gateway) awaitSnapshot(ctx context.Context, db *clusterdb.DB, team, id string, uploaded bool) (clusterdb.Snapshot, error) {
	t0 := time.Now()
	if uploaded {
		defer timing.Since(ctx, "export", t0)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		row, err := db.FindSnapshot(ctx, team, id)
		if err == nil && (!uploaded || row.StoreRoot != "") {
			return row, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return row, fmt.Errorf("the parent's state did not reach the chunk store in time (%v); retry later", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// children creates k children of sandbox id from its transfer snapshot
// (row) on hosts other than its own, h, as creates are placed; root, if
// not "", is the snapshot's image that h offers (the children's hosts
// import it from h first). A child that fails that way (a host refusing
// it, 409, or failing it, 5xx: one of an older cellfork that does not
// know the offer, or an import that found neither the peer nor the store
// holding the image) is made again once the upload is done, from the
// store, as are the children after it. An entry per child, as a fork
// answers.
func (g *Gateway) children(r *http.Request, c caller, id string, h clusterdb.Host, k int, row clusterdb.Snapshot, mem int64, timeout any, root string) []any {
	create := map[string]any{"templateID": row.ID}
	if timeout != nil {
		create["timeout"] = timeout
	}
	cb := mustJSON(create)
	out := make([]any, 0, k)
	for len(out) < k {
		rec := httptest.NewRecorder()
		cr := r.Clone(r.Context())
		cr.Method, cr.URL.Path = http.MethodPost, "/v2/sandboxes"
		cr.Header.Set(api.HeaderForkOf, id) // a fork child: a merge takes it back
		if root != "" {
			cr.Header.Set(api.HeaderImagePeer, h.Addr)
			cr.Header.Set(api.HeaderImageRoot, root)
		}
		req := placement.Request{Region: row.Region, MemoryMB: mem, Versions: []string{"runsc=" + row.Runtime}, Exclude: map[int]bool{h.Slot: true}}
		reasons, err := g.place(rec, cr, c, req, cb)
		if err != nil && !errors.Is(err, errNoHost) {
			api.Fail(g.log, rec, cr, err)
		}
		if root != "" && (rec.Code == http.StatusConflict || rec.Code >= 500 || reasons["failed the create"] > 0) {
			g.log.Warn("a fork child from the parent's host failed; making it from the chunk store once the upload is done",
				"snapshot.id", row.ID, "status", rec.Code, "body", strings.TrimSpace(rec.Body.String()), "reasons", reasons.String())
			db := g.db.Load()
			if db == nil {
				out = append(out, forkError(http.StatusServiceUnavailable, "the cluster database is unavailable; retry later"))
				continue
			}
			up, err := g.awaitSnapshot(r.Context(), db, c.team.ID, row.ID, true)
			if err != nil {
				out = append(out, forkError(http.StatusServiceUnavailable, "%s", err))
				continue
			}
			row, root = up, ""
			continue
		}
		switch {
		case errors.Is(err, errNoHost):
			out = append(out, forkError(http.StatusServiceUnavailable, "no host has room for this child: %s", reasons))
		case rec.Code == http.StatusCreated:
			var sb map[string]any
			_ = json.Unmarshal(rec.Body.Bytes(), &sb)
			out = append(out, map[string]any{"sandbox": sb})
		default:
			var e struct {
				Message string `json:"message"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &e)
			out = append(out, forkError(rec.Code, "%s", e.Message))
		}
	}
	return out
}

// forkError is a fork's entry for a child that failed.
func forkError(code int, format string, args ...any) any {
	return map[string]any{"error": map[string]any{"code": code, "message": fmt.Sprintf(format, args...)}}
}

// offer asks host h to offer the image of its snapshot id to the other
// hosts (a call to its image endpoints, signed for them) and returns the
// root of the image's manifest.
func (g *Gateway) offer(ctx context.Context, h clusterdb.Host, team, id string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+h.Addr+"/internal/images/offers?snapshot="+url.QueryEscape(id), nil)
	if err != nil {
		return "", err
	}
	clusterauth.SignPeer(req, g.secrets.Load().Internal, team, time.Now())
	timing.Inject(ctx, req.Header)
	resp, err := g.toHosts.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	var o struct {
		Root string `json:"root"`
	}
	if err := json.Unmarshal(body, &o); err != nil || o.Root == "" {
		return "", fmt.Errorf("an offer with no root: %s", body)
	}
	return o.Root, nil
}

// hostAnswer is a host's answer, passed on as it is.
type hostAnswer struct {
	status int
	body   []byte
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return append(b, '\n')
}
