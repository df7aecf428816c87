package gateway

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/errdefs"
)

// list answers a team's sandbox list from the cluster database (as its
// hosts last wrote their rows): filters and pages as one host does. A
// sandbox whose host is lost is listed, as state lost, with the running
// ones.
func (g *Gateway) list(w http.ResponseWriter, r *http.Request, c caller) {
	q, err := api.ParseList(r.URL.Query())
	if err != nil {
		api.Fail(g.log, w, r, err)
		return
	}
	db := g.db.Load()
	if db == nil {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later"))
		return
	}
	states := slices.Clone(q.States)
	if slices.Contains(states, "running") {
		states = append(states, "lost", "creating")
	}
	rows, err := db.ListSandboxes(r.Context(), clusterdb.ListFilter{Team: c.team.ID, States: states, Metadata: q.Metadata,
		Template: q.Template, After: q.StartedAfter, Desc: q.Desc, CursorStarted: q.AfterStarted, CursorID: q.AfterID, Limit: q.Limit + 1})
	if err != nil {
		api.Fail(g.log, w, r, err)
		return
	}
	page := []any{}
	for i, row := range rows {
		if i == q.Limit {
			last := rows[i-1]
			w.Header().Set("X-Next-Token", api.PageToken(last.StartedAt, last.ID))
			break
		}
		if row.State == "creating" {
			continue // not there yet
		}
		page = append(page, withState(row.Doc, row.State))
	}
	api.WriteJSON(w, http.StatusOK, page)
}

// listSnapshots answers a team's snapshots, oldest first, filtered and
// paged as one host does.
func (g *Gateway) listSnapshots(w http.ResponseWriter, r *http.Request, c caller) {
	q := r.URL.Query()
	limit := 100
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > 1000 {
			api.Fail(g.log, w, r, errdefs.New(errdefs.ErrInvalidArgument, "limit must be between 1 and 1000"))
			return
		}
		limit = n
	}
	after := ""
	if v := q.Get("nextToken"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil || !strings.Contains(string(b), ":") {
			api.Fail(g.log, w, r, errdefs.New(errdefs.ErrInvalidArgument, "invalid nextToken"))
			return
		}
		after = string(b)
	}
	all, err := g.snapshots(r, c)
	if err != nil {
		api.Fail(g.log, w, r, err)
		return
	}
	page := []json.RawMessage{}
	for i, sn := range all {
		key := sn.CreatedAt.Format("20060102150405.000000000") + ":" + sn.ID
		if after != "" && key <= after || q.Get("sandboxID") != "" && sn.SandboxID != q.Get("sandboxID") ||
			q.Get("name") != "" && q.Get("name") != sn.ID && !slices.Contains(sn.Names, q.Get("name")) {
			continue
		}
		if len(page) == limit {
			prev := all[i-1]
			w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString(
				[]byte(prev.CreatedAt.Format("20060102150405.000000000")+":"+prev.ID)))
			break
		}
		page = append(page, sn.Doc)
	}
	api.WriteJSON(w, http.StatusOK, page)
}

func (g *Gateway) snapshots(r *http.Request, c caller) ([]clusterdb.Snapshot, error) {
	db := g.db.Load()
	if db == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later")
	}
	return db.ListSnapshots(r.Context(), c.team.ID)
}

func (g *Gateway) snapshotUsage(w http.ResponseWriter, r *http.Request, c caller) {
	all, err := g.snapshots(r, c)
	if err != nil {
		api.Fail(g.log, w, r, err)
		return
	}
	var total int64
	for _, sn := range all {
		var d struct {
			SizeBytes int64 `json:"sizeBytes"`
		}
		_ = json.Unmarshal(sn.Doc, &d)
		total += d.SizeBytes
	}
	api.WriteJSON(w, http.StatusOK, map[string]int64{"totalBytes": total, "capBytes": 0, "count": int64(len(all))})
}

// snapshotOp answers GET /snapshots/{id} from the database and sends a
// delete to the host holding the image.
func (g *Gateway) snapshotOp(w http.ResponseWriter, r *http.Request, c caller) {
	idOrName := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	db := g.db.Load()
	if db == nil {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later"))
		return
	}
	sn, err := db.FindSnapshot(r.Context(), c.team.ID, idOrName)
	if err != nil {
		api.Fail(g.log, w, r, err)
		return
	}
	switch r.Method {
	case http.MethodGet:
		api.WriteJSON(w, http.StatusOK, sn.Doc)
		return
	case http.MethodDelete:
	default:
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path))
		return
	}
	h, ok := g.view.Load().table.Host(sn.HostSlot)
	if !ok || h.State == "lost" {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "snapshot %q is on a host that does not answer", sn.ID))
		return
	}
	r.URL.Path = "/snapshots/" + sn.ID
	g.forward(w, r, toHost(h.Addr, c.team.ID, ""), nil)
}
