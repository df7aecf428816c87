package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/metrics"
	"github.com/cellfork/cellfork/internal/timing"
)

// TestObserved: what the gateway counts of an answered request.
func TestObserved(t *testing.T) {
	reg, gm := metrics.NewGatewayRegistry("test")
	g := New(Config{Metrics: gm})
	g.view.Store(&view{Region: clusterdb.Region{Name: "eu"}, Hosts: []clusterdb.Host{{State: "active"}, {State: "active"}, {State: "lost"}}})

	data := httptest.NewRequest(http.MethodPost, "/execute", nil)
	data.Header.Set("E2b-Sandbox-Id", "abc")
	data.Header.Set("E2b-Sandbox-Port", "49999")
	ctx, rec := timing.With(context.Background())
	timing.Add(ctx, "route", 2*time.Millisecond)
	g.observed(data)(http.StatusOK, rec, nil, 5*time.Millisecond)
	g.observed(data)(http.StatusUnauthorized, nil, nil, time.Millisecond) // no token sent

	control := httptest.NewRequest(http.MethodGet, "/v2/sandboxes", nil)
	control.Header.Set("X-API-KEY", "wrong")
	g.observed(control)(http.StatusUnauthorized, nil, nil, time.Millisecond)

	rr := httptest.NewRecorder()
	metrics.Handler(reg).ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rr.Body.String()
	for _, want := range []string{
		`cellfork_gateway_requests_total{code="200",plane="data"} 1`,
		`cellfork_gateway_requests_total{code="401",plane="control"} 1`,
		`cellfork_gateway_route_duration_seconds_count{outcome="ok",plane="data"} 1`,
		`cellfork_auth_failures_total{reason="missing_token"} 1`,
		`cellfork_auth_failures_total{reason="invalid_key"} 1`,
		`cellfork_gateway_hosts{region="eu",state="active"} 2`,
		`cellfork_gateway_hosts{region="eu",state="lost"} 1`,
		`cellfork_build_info{`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("gateway metrics lack %s", want)
		}
	}
}

// TestControlRoute: a control-plane span's name is its route, never an id
// or a path a client made up.
func TestControlRoute(t *testing.T) {
	for p, want := range map[string]string{
		"/v2/sandboxes":                       "/v2/sandboxes",
		"/r/us/v2/sandboxes":                  "/v2/sandboxes",
		"/sandboxes/i01a2b3c4d5e6f7g8h9j0":    "/sandboxes/{id}",
		"/sandboxes/i01a2b3c4d5e6f7g8h9/fork": "/sandboxes/{id}/fork",
		"/v2/sandboxes/abc/connect":           "/v2/sandboxes/{id}/connect",
		"/sandboxes/abc/made-up":              "unknown",
		"/sandboxes/abc/fork/more":            "unknown",
		"/snapshots/s0123":                    "/snapshots/{snapshotID}",
		"/snapshots/usage":                    "/snapshots/usage",
		"/templates/base":                     "/templates/{snapshotID}",
		"/dashboard/app.js":                   "/dashboard/",
		"/whatever/x":                         "unknown",
	} {
		if got := controlRoute(p); got != want {
			t.Errorf("controlRoute(%q) = %q, want %q", p, got, want)
		}
	}
}
