package gateway

import (
	"net/http"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/telemetry"
	"github.com/cellfork/cellfork/internal/timing"
)

// observed is what ServeHTTP learns of a request once it is answered:
// its metrics (internal/metrics.Gateway) and the end of its span.
func (g *Gateway) observed(r *http.Request) func(int, *timing.Recorder, *telemetry.Request, time.Duration) {
	id, port, dataPlane := api.DataPlaneTarget(r)
	plane := "control"
	if dataPlane {
		plane = "data"
	}
	return func(status int, rec *timing.Recorder, span *telemetry.Request, _ time.Duration) {
		m := g.cfg.Metrics
		m.Answered(plane, status)
		// The data plane's route phase is the routing (id to host, token)
		// before the forward; the control plane's covers the whole call.
		if dataPlane && rec != nil {
			rec.Each(func(phase string, d time.Duration) {
				if phase == "route" {
					outcome := "ok"
					if status == http.StatusBadGateway {
						outcome = "unreachable"
					}
					m.Routed(plane, outcome, d)
				}
			})
		}
		if status == http.StatusUnauthorized {
			m.AuthFailure(authReason(r, dataPlane, port))
		}
		if span != nil {
			route := r.Method + " " + controlRoute(r.URL.Path)
			if dataPlane {
				route = api.DataRoute(r)
			}
			span.Finish(route, "gateway "+plane, id, status)
		}
	}
}

// sandboxRoutes are the paths under /sandboxes/{id}/ a span is named by.
var sandboxRoutes = map[string]bool{"timeout": true, "refreshes": true, "connect": true, "metrics": true, "pause": true,
	"resume": true, "snapshots": true, "fork": true, "rollback": true, "merge": true, "network": true}

// controlRoute names a control-plane path for its span from a small set,
// as a host's routes are named: ids as {id} and {snapshotID}, and a path
// the gateway does not serve as "unknown" (a client chooses paths: a span
// name must not carry them).
func controlRoute(p string) string {
	if rest, ok := strings.CutPrefix(p, "/r/"); ok {
		_, p, _ = strings.Cut(rest, "/")
		p = "/" + p
	}
	switch p {
	case "/sandboxes", "/v2/sandboxes", "/snapshots", "/snapshots/usage", "/templates", "/v3/templates", "/hosts",
		"/health", "/openapi.yaml", "/dashboard":
		return p
	}
	if strings.HasPrefix(p, "/dashboard/") {
		return "/dashboard/"
	}
	if id := sandboxInPath(p); id != "" {
		prefix, rest, _ := strings.Cut(p, "/sandboxes/"+id)
		route := prefix + "/sandboxes/{id}"
		switch sub := strings.TrimPrefix(rest, "/"); {
		case sub == "":
			return route
		case sandboxRoutes[sub]:
			return route + "/" + sub
		}
		return "unknown"
	}
	for _, prefix := range []string{"/snapshots/", "/templates/", "/v2/templates/"} {
		if rest, ok := strings.CutPrefix(p, prefix); ok && rest != "" && !strings.Contains(rest, "/") {
			return prefix + "{snapshotID}"
		}
	}
	return "unknown"
}

// authReason says why a refused request was refused, from what it sent.
func authReason(r *http.Request, dataPlane bool, port int) string {
	if dataPlane {
		if r.Header.Get("X-Access-Token") == "" && r.Header.Get("E2b-Traffic-Access-Token") == "" && r.URL.Query().Get("signature") == "" {
			return "missing_token"
		}
		return "invalid_token"
	}
	if r.Header.Get("X-API-KEY") == "" && r.Header.Get("Authorization") == "" {
		return "missing_key"
	}
	return "invalid_key"
}

// hostCounts counts the region's hosts by state, for
// cellfork_gateway_hosts.
func (g *Gateway) hostCounts() map[[2]string]int {
	out := map[[2]string]int{}
	v := g.view.Load()
	if v == nil {
		return out
	}
	for _, h := range v.Hosts {
		out[[2]string{v.Region.Name, h.State}]++
	}
	return out
}
