package api

import (
	"net/http"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/telemetry"
	"github.com/cellfork/cellfork/internal/timing"
)

// operations names the routes' operations for metrics and spans; a route
// not listed is named by its pattern (a fixed string either way: never a
// sandbox id).
var operations = map[string]string{
	"GET /health":                     "health",
	"GET /openapi.yaml":               "openapi",
	"POST /v2/sandboxes":              "create",
	"POST /sandboxes":                 "create",
	"GET /v2/sandboxes":               "list",
	"GET /sandboxes":                  "list",
	"GET /sandboxes/{id}":             "get",
	"DELETE /sandboxes/{id}":          "kill",
	"POST /sandboxes/{id}/timeout":    "timeout",
	"POST /sandboxes/{id}/refreshes":  "refresh",
	"POST /v2/sandboxes/{id}/connect": "connect",
	"POST /sandboxes/{id}/connect":    "connect",
	"GET /sandboxes/{id}/metrics":     "metrics",
	"POST /sandboxes/{id}/pause":      "pause",
	"POST /sandboxes/{id}/resume":     "resume",
	"POST /sandboxes/{id}/snapshots":  "snapshot",
	"GET /snapshots":                  "list_snapshots",
	"GET /snapshots/usage":            "snapshot_usage",
	"GET /snapshots/{snapshotID}":     "get_snapshot",
	"DELETE /snapshots/{snapshotID}":  "delete_snapshot",
	"DELETE /templates/{snapshotID}":  "delete_snapshot",
	"POST /sandboxes/{id}/fork":       "fork",
	"POST /sandboxes/{id}/rollback":   "rollback",
	"POST /sandboxes/{id}/merge":      "merge",
	"PUT /sandboxes/{id}/network":     "set_network",
	"GET /sandboxes/{id}/network":     "get_network",
	"GET /metrics":                    "scrape",
	"GET /host":                       "host",
	"GET /dashboard/":                 "dashboard",
	"GET /dashboard":                  "dashboard",
	"GET /sandboxes/metrics":          "metrics_many",
}

// controlOperation names a routed control-plane request's operation.
func controlOperation(pattern string) string {
	if op, ok := operations[pattern]; ok {
		return op
	}
	if pattern == "" || pattern == "/" {
		return "unknown"
	}
	return pattern
}

// dataOperation names a data-plane request's operation by the agent's
// port and path.
func dataOperation(t target, path string) string {
	switch t.port {
	case envd.CodeInterpreterPort:
		if path == "/execute" {
			return "run_code"
		}
		return "code_interpreter"
	case envd.Port:
		switch {
		case strings.HasPrefix(path, "/process.Process/"):
			return "process"
		case strings.HasPrefix(path, "/filesystem.Filesystem/"):
			return "filesystem"
		case path == "/files":
			return "files"
		}
		return "envd"
	}
	return "port"
}

// agentPort names the agent's ports for metrics ("" for a user's port).
func agentPort(port int) string {
	switch port {
	case envd.Port:
		return "envd"
	case envd.CodeInterpreterPort:
		return "code_interpreter"
	}
	return ""
}

// dataRoute is a data-plane span's name, from a small set: the fixed
// paths by path, the rest by operation (the span's url.path attribute has
// the path; a user's port's paths are the user's, and any path reaches
// the agent).
func dataRoute(r *http.Request, op string) string {
	if op == "run_code" || op == "files" {
		return r.Method + " " + r.URL.Path
	}
	return r.Method + " " + op
}

// DataRoute names a data-plane request's span as a host names it ("POST
// /execute", "POST process"), for the gateway's span of the same request.
func DataRoute(r *http.Request) string {
	t, _ := dataPlaneTarget(r)
	return dataRoute(r, dataOperation(t, r.URL.Path))
}

// observe records a served request in the metrics and ends its span.
func (s *Server) observe(r *http.Request, t target, dataPlane bool, status int, rec *timing.Recorder, span *telemetry.Request, total time.Duration) {
	var op, route, sandboxID string
	if dataPlane {
		op = dataOperation(t, r.URL.Path)
		route, sandboxID = dataRoute(r, op), t.sandboxID
	} else {
		pattern := r.Pattern
		if pattern == "" { // refused before routing
			_, pattern = s.mux.Handler(r)
		}
		op, route, sandboxID = controlOperation(pattern), pattern, r.PathValue("id")
	}
	span.Finish(route, op, sandboxID, status)
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.ObserveRequest(op, status, rec, total)
	}
}

// inFlight counts a request being served.
func (s *Server) inFlight(dataPlane bool) func() {
	if s.cfg.Metrics == nil {
		return func() {}
	}
	if dataPlane {
		return s.cfg.Metrics.InFlight("data")
	}
	return s.cfg.Metrics.InFlight("control")
}

// created counts a sandbox created.
func (s *Server) created(sb *sandbox.Sandbox) {
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Created(sb.BootMode, sb.TemplateID)
	}
}

// authFailed counts a request refused for authentication.
func (s *Server) authFailed(reason string) {
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.AuthFailure(reason)
	}
}

// agentError counts a failed data-plane request to the agent's port.
func (s *Server) agentError(port int, reason string) {
	if p := agentPort(port); p != "" && s.cfg.Metrics != nil {
		s.cfg.Metrics.AgentError(p, reason)
	}
}
