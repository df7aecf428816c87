package gateway

import (
	"errors"
	"net/http"
	"regexp"
	"strings"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/errdefs"
)

// A region's custom templates are built and kept by one host, its template
// host: the host of the lowest slot. It publishes every build it finishes
// (layers and warm image) to the chunk store and the database, so that
// creates from a template go to any host, which pulls it the first time
// (internal/templates, shared.go). The template API itself (builds,
// uploads, listings, tags) is forwarded to the template host.

// templateAPI reports whether p is a path of E2B's template API.
func templateAPI(p string) bool {
	return p == "/templates" || strings.HasPrefix(p, "/templates/") ||
		p == "/v2/templates" || strings.HasPrefix(p, "/v2/templates/") || p == "/v3/templates"
}

// signedUploadRE is the path of a template file upload link.
var signedUploadRE = regexp.MustCompile(`^/templates/[^/]+/files/[0-9a-f]{64}$`)

// templateHost returns the region's template host.
func (g *Gateway) templateHost() (clusterdb.Host, error) {
	v := g.view.Load()
	var th clusterdb.Host
	for _, h := range v.Hosts {
		if h.Region == v.Region.ID && (th.Slot == 0 || h.Slot < th.Slot) {
			th = h
		}
	}
	if th.Slot == 0 {
		return th, errdefs.New(errdefs.ErrUnavailable, "region %s has no host", v.Region.Name)
	}
	if th.State == "lost" || th.Silent() {
		return th, errdefs.New(errdefs.ErrUnavailable,
			"custom templates of region %s are built and kept on host %d, which does not answer; sandboxes from templates already built still start on every host", v.Region.Name, th.Slot)
	}
	return th, nil
}

// templateOp forwards a template API call to the template host, for team.
func (g *Gateway) templateOp(w http.ResponseWriter, r *http.Request, team string) {
	h, err := g.templateHost()
	if err != nil {
		api.Fail(g.log, w, r, err)
		return
	}
	g.forward(w, r, toHost(h.Addr, team, ""), nil)
}

// deleteTemplate is E2B's DELETE /templates/{id}: of a snapshot (E2B's
// snapshots are templates), on its host, else of a custom template.
func (g *Gateway) deleteTemplate(w http.ResponseWriter, r *http.Request, c caller) {
	idOrName := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	db := g.db.Load()
	if db == nil {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later"))
		return
	}
	if _, err := db.FindSnapshot(r.Context(), c.team.ID, idOrName); err == nil {
		g.snapshotOp(w, r, c)
		return
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		api.Fail(g.log, w, r, err)
		return
	}
	g.templateOp(w, r, c.team.ID)
}
