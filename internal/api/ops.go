package api

import (
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/api/apitypes"
	"github.com/cellfork/cellfork/internal/dashboard"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// opsRoutes serves what operators look at: Prometheus metrics, the host's
// levels, many sandboxes' resource use at once, and the dashboard.
func (s *Server) opsRoutes() {
	if s.cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", s.cfg.Metrics.Handler())
	}
	s.mux.HandleFunc("GET /host", s.host)
	s.mux.HandleFunc("GET /sandboxes/metrics", s.metricsMany)
	s.mux.Handle("GET /dashboard/", http.StripPrefix("/dashboard", dashboard.Handler()))
	s.mux.HandleFunc("GET /dashboard", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/dashboard/", http.StatusMovedPermanently)
	})
}

// isDashboard reports whether path is one of the dashboard's static
// files, which need no key.
func isDashboard(path string) bool {
	return path == "/dashboard" || strings.HasPrefix(path, "/dashboard/")
}

// host serves GET /host: the host's levels (what /metrics reports as
// gauges), for the dashboard.
func (s *Server) host(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Host == nil {
		s.fail(w, r, errdefs.New(errdefs.ErrNotFound, "this daemon reports no host levels"))
		return
	}
	st := s.cfg.Host.Stats(r.Context())
	b := apitypes.Host{Sandboxes: map[string]int{"running": 0, "paused": 0}, Templates: map[string]map[string]int{}}
	for _, sb := range st.Sandboxes {
		b.Sandboxes[sb.State]++
		if b.Templates[sb.Template] == nil {
			b.Templates[sb.Template] = map[string]int{}
		}
		b.Templates[sb.Template][sb.State]++
		if sb.State == "running" {
			b.Allocated.Cpus += sb.CPUs
			b.Allocated.MemoryBytes += sb.MemoryBytes
		}
	}
	p := &b.Pool
	p.Ready, p.ReadyTarget, p.Shells, p.ShellTarget = st.Pool.Ready, st.Pool.ReadyTarget, st.Pool.Shells, st.Pool.ShellTarget
	p.Standbys, p.StandbysReady, p.StandbyMax = st.Pool.Standbys, st.Pool.StandbysReady, st.Pool.StandbyMax
	if p.Ready == nil {
		p.Ready = map[string]int{}
	}
	a := &b.Admission
	a.Running, a.Waiting, a.Slots, a.QueueCapacity = st.Admission.Running, st.Admission.Waiting, st.Admission.Slots, st.Admission.QueueCap
	b.Snapshots.Count, b.Snapshots.Bytes, b.Snapshots.CapBytes = st.Snapshots.Count, st.Snapshots.Bytes, st.Snapshots.CapBytes
	c := &b.Capacity
	c.Cpus, c.MemoryBytes, c.MemoryAvailableBytes = st.Capacity.CPUs, st.Capacity.MemoryBytes, st.Capacity.MemoryAvailableBytes
	c.DiskBytes, c.DiskFreeBytes = st.Capacity.DiskBytes, st.Capacity.DiskFreeBytes
	writeJSON(w, http.StatusOK, b)
}

// maxMetricsIDs bounds GET /sandboxes/metrics, as E2B's does.
const maxMetricsIDs = 100

// sandboxIDRE is what a sandbox id can be (as the proxy's Host form).
var sandboxIDRE = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

// metricsMany is E2B's GET /sandboxes/metrics?sandbox_ids=a,b: the
// current sample of each named sandbox; unknown ids are left out.
func (s *Server) metricsMany(w http.ResponseWriter, r *http.Request) {
	var ids []string
	for _, id := range strings.Split(r.URL.Query().Get("sandbox_ids"), ",") {
		if id = strings.TrimSpace(id); id != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "sandbox_ids is required: a comma-separated list of sandbox ids"))
		return
	}
	if len(ids) > maxMetricsIDs {
		s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "sandbox_ids: at most %d ids", maxMetricsIDs))
		return
	}
	for _, id := range ids {
		if !sandboxIDRE.MatchString(id) {
			s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "sandbox_ids: %q is not a sandbox id", id))
			return
		}
	}
	out := apitypes.SandboxesWithMetrics{Sandboxes: map[string]apitypes.SandboxMetric{}}
	now := time.Now()
	for _, id := range ids {
		// The last few seconds reach now: the latest sample, taken now if
		// the last is older than a second.
		ms, err := s.m.Metrics(r.Context(), id, now.Add(-5*time.Second), time.Time{})
		if err != nil || len(ms) == 0 {
			continue // killed meanwhile, or never was
		}
		out.Sandboxes[id] = metricJSON(ms[len(ms)-1])
	}
	writeJSON(w, http.StatusOK, out)
}

// metricJSON is E2B's SandboxMetric.
func metricJSON(m sandbox.Metric) apitypes.SandboxMetric {
	return apitypes.SandboxMetric{
		Timestamp: m.At, TimestampUnix: m.At.Unix(),
		CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
		MemUsed: int64(m.MemUsed), MemTotal: int64(m.MemTotal), MemCache: int64(m.MemCache),
		DiskUsed: int64(m.DiskUsed), DiskTotal: int64(m.DiskTotal),
	}
}
