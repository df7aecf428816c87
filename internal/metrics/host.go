// Package metrics exports cellfork's Prometheus metrics: the host's levels
// (sandboxes, pool, standbys, admission, snapshot disk, capacity), read
// from a Source at scrape time, and counters and histograms of what
// happens (requests and their phases, creates, restores, checkpoints,
// refused egress, agent and auth failures). Names are in names.go. The
// daemon registers Host; the cluster gateway will register Gateway.
package metrics

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/cellfork/cellfork/internal/timing"
)

// Stats is what a scrape reads of the host.
type Stats struct {
	Sandboxes []Sandbox     `json:"-"` // one per sandbox
	Pool      Pool          `json:"pool"`
	Admission Admission     `json:"admission"`
	Snapshots SnapshotUsage `json:"snapshots"`
	Capacity  Capacity      `json:"capacity"`
}

// Sandbox is one sandbox's part of Stats.
type Sandbox struct {
	State       string // running, paused
	Template    string // a label: the template's name, or "snapshot"
	CPUs        int
	MemoryBytes int64
	OnDisk      bool // paused to disk
}

// Pool is the pool's fill and targets.
type Pool struct {
	Ready         map[string]int `json:"ready"` // by template
	ReadyTarget   int            `json:"readyTarget"`
	Shells        int            `json:"shells"`
	ShellTarget   int            `json:"shellTarget"`
	Standbys      int            `json:"standbys"`      // snapshots that keep a standby
	StandbysReady int            `json:"standbysReady"` // of which restored and frozen now
	StandbyMax    int            `json:"standbyMax"`
}

// Admission is the start line's levels and bounds.
type Admission struct {
	Running  int `json:"running"`
	Waiting  int `json:"waiting"`
	Slots    int `json:"slots"`
	QueueCap int `json:"queueCapacity"`
}

// SnapshotUsage is the snapshots' disk use.
type SnapshotUsage struct {
	Count    int   `json:"count"`
	Bytes    int64 `json:"bytes"`
	CapBytes int64 `json:"capBytes"`
	// Snapshots by upload state (all 0 without a chunk store).
	Uploading int `json:"uploading"`
	Uploaded  int `json:"uploaded"`
	Failed    int `json:"uploadFailed"`
}

// Capacity is the host's size and what is left.
type Capacity struct {
	CPUs                 int   `json:"cpus"`
	MemoryBytes          int64 `json:"memoryBytes"`
	MemoryAvailableBytes int64 `json:"memoryAvailableBytes"`
	DiskBytes            int64 `json:"diskBytes"`
	DiskFreeBytes        int64 `json:"diskFreeBytes"`
}

// Source gives the levels a scrape reports. Implementations must be safe
// for concurrent use, and fast: a scrape with 1,000 sandboxes takes under
// 10 ms (BenchmarkScrape).
type Source interface {
	Stats(ctx context.Context) Stats
}

// Config configures the host's metrics.
type Config struct {
	Source  Source
	Version string
	// TemplateLabel maps a template id as a caller gave it (an alias, a
	// snapshot id) to a label value from a small set. Nil: as given.
	TemplateLabel func(templateID string) string
}

// Host is the daemon's metrics. Safe for concurrent use.
type Host struct {
	cfg Config
	reg *prometheus.Registry

	requests        *prometheus.CounterVec
	inFlight        *prometheus.GaugeVec
	operation       *prometheus.HistogramVec
	creates         *prometheus.CounterVec
	admissionReject *prometheus.CounterVec
	runtimeOps      *prometheus.CounterVec
	runtimeLatency  *prometheus.HistogramVec
	restores        *prometheus.CounterVec
	restoreBytes    *prometheus.CounterVec
	checkpoints     *prometheus.CounterVec
	checkpointBytes *prometheus.CounterVec
	refills         *prometheus.CounterVec
	egressDenied    *prometheus.CounterVec
	agentErrors     *prometheus.CounterVec
	authFailures    *prometheus.CounterVec
}

// NewHost returns the daemon's metrics on a registry of their own (with
// the Go runtime's and the process's).
func NewHost(cfg Config) *Host {
	h := &Host{
		cfg:             cfg,
		reg:             prometheus.NewRegistry(),
		requests:        defRequests.counter(),
		inFlight:        defRequestsInFlight.gauge(),
		operation:       defOperation.histogram(LatencyBuckets),
		creates:         defCreates.counter(),
		admissionReject: defAdmissionReject.counter(),
		runtimeOps:      defRuntimeOps.counter(),
		runtimeLatency:  defRuntimeLatency.histogram(LatencyBuckets),
		restores:        defRestores.counter(),
		restoreBytes:    defRestoreBytes.counter(),
		checkpoints:     defCheckpoints.counter(),
		checkpointBytes: defCheckpointBytes.counter(),
		refills:         defPoolRefills.counter(),
		egressDenied:    defEgressDenied.counter(),
		agentErrors:     defAgentErrors.counter(),
		authFailures:    defAuthFailures.counter(),
	}
	h.reg.MustRegister(h.requests, h.inFlight, h.operation, h.creates, h.admissionReject, h.runtimeOps,
		h.runtimeLatency, h.restores, h.restoreBytes, h.checkpoints, h.checkpointBytes, h.refills,
		h.egressDenied, h.agentErrors, h.authFailures)
	h.reg.MustRegister(collectorsFor(cfg.Version)...)
	// Series that exist from the start, so that rates and alerts see a 0
	// before the first event.
	for _, r := range []string{"firewall", "proxy", "dns"} {
		h.egressDenied.WithLabelValues(r)
	}
	if cfg.Source != nil {
		h.reg.MustRegister(&levels{src: cfg.Source})
	}
	return h
}

// collectorsFor are what every cellfork process exports: the Go
// runtime's and the process's metrics, and cellfork_build_info.
func collectorsFor(version string) []prometheus.Collector {
	build := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: defBuildInfo.name, Help: defBuildInfo.help,
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()}})
	build.Set(1)
	return []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), build}
}

// Registry is where the metrics are registered (the gateway's own metrics
// may join them).
func (h *Host) Registry() *prometheus.Registry { return h.reg }

// Handler serves the metrics in Prometheus's text format (or
// OpenMetrics, when the scraper asks).
func (h *Host) Handler() http.Handler { return Handler(h.reg) }

// TemplateLabel maps a template id to its label value.
func (h *Host) TemplateLabel(id string) string {
	if h.cfg.TemplateLabel != nil {
		return h.cfg.TemplateLabel(id)
	}
	return id
}

// ObserveRequest counts one answered request and its latency, in total
// and per phase recorded on rec (nil: total only).
func (h *Host) ObserveRequest(operation string, code int, rec *timing.Recorder, total time.Duration) {
	h.requests.WithLabelValues(operation, strconv.Itoa(code)).Inc()
	h.operation.WithLabelValues(operation, "total").Observe(total.Seconds())
	if rec != nil {
		rec.Each(func(phase string, d time.Duration) {
			h.operation.WithLabelValues(operation, phase).Observe(d.Seconds())
		})
	}
	if code == http.StatusServiceUnavailable {
		h.admissionReject.WithLabelValues(operation).Inc()
	}
}

// InFlight counts a request of plane (control, data) being served until
// the returned func is called.
func (h *Host) InFlight(plane string) func() {
	g := h.inFlight.WithLabelValues(plane)
	g.Inc()
	return g.Dec
}

// Created counts a sandbox created with bootMode from templateID.
func (h *Host) Created(bootMode, templateID string) {
	h.creates.WithLabelValues(bootMode, h.TemplateLabel(templateID)).Inc()
}

// AgentError counts a failed data-plane request to the agent's port
// (envd, code_interpreter) for reason.
func (h *Host) AgentError(port, reason string) { h.agentErrors.WithLabelValues(port, reason).Inc() }

// AuthFailure counts a request refused for authentication.
func (h *Host) AuthFailure(reason string) { h.authFailures.WithLabelValues(reason).Inc() }

// levels is the collector of the host's levels: one Source.Stats per
// scrape, turned into gauges.
type levels struct {
	src  Source
	last atomic.Int64 // how long the previous gather took (ns)
}

var levelDefs = []def{defSandboxes, defSandboxesPausedOnDisk, defAllocatedCPUs, defAllocatedMemory,
	defPoolReady, defPoolReadyTarget, defPoolShells, defPoolShellsTarget, defStandbys, defStandbysMax,
	defStartsRunning, defStartsWaiting, defStartSlots, defStartQueue, defSnapshots, defSnapshotUploads, defSnapshotBytes,
	defSnapshotCap, defHostCPUs, defHostMemory, defHostMemoryAvailable, defHostDiskFree, defHostDisk, defScrape}

var levelDescs = func() map[string]*prometheus.Desc {
	m := map[string]*prometheus.Desc{}
	for _, d := range levelDefs {
		m[d.name] = d.desc()
	}
	return m
}()

func (c *levels) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range levelDescs {
		ch <- d
	}
}

func (c *levels) Collect(ch chan<- prometheus.Metric) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st := c.src.Stats(ctx)
	gauge := func(d def, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(levelDescs[d.name], prometheus.GaugeValue, v, labels...)
	}
	// Both states of every template with a sandbox are reported, so that
	// a state's series drops to 0 rather than vanishing.
	states := []string{"running", "paused"}
	counts := map[string]*[2]int{} // template -> by state
	other := map[[2]string]int{}   // a state neither (none today)
	var cpus, onDisk int
	var mem int64
	for _, sb := range st.Sandboxes {
		c := counts[sb.Template]
		if c == nil {
			c = &[2]int{}
			counts[sb.Template] = c
		}
		switch sb.State {
		case "running":
			c[0]++
			cpus += sb.CPUs
			mem += sb.MemoryBytes
		case "paused":
			c[1]++
		default:
			other[[2]string{sb.State, sb.Template}]++
		}
		if sb.OnDisk {
			onDisk++
		}
	}
	for t, c := range counts {
		for i, state := range states {
			gauge(defSandboxes, float64(c[i]), state, t)
		}
	}
	for k, n := range other {
		gauge(defSandboxes, float64(n), k[0], k[1])
	}
	gauge(defSandboxesPausedOnDisk, float64(onDisk))
	gauge(defAllocatedCPUs, float64(cpus))
	gauge(defAllocatedMemory, float64(mem))
	for t, n := range st.Pool.Ready {
		gauge(defPoolReady, float64(n), t)
	}
	gauge(defPoolReadyTarget, float64(st.Pool.ReadyTarget))
	gauge(defPoolShells, float64(st.Pool.Shells))
	gauge(defPoolShellsTarget, float64(st.Pool.ShellTarget))
	gauge(defStandbys, float64(st.Pool.StandbysReady), "ready")
	gauge(defStandbys, float64(st.Pool.Standbys-st.Pool.StandbysReady), "pending")
	gauge(defStandbysMax, float64(st.Pool.StandbyMax))
	gauge(defStartsRunning, float64(st.Admission.Running))
	gauge(defStartsWaiting, float64(st.Admission.Waiting))
	gauge(defStartSlots, float64(st.Admission.Slots))
	gauge(defStartQueue, float64(st.Admission.QueueCap))
	gauge(defSnapshots, float64(st.Snapshots.Count))
	gauge(defSnapshotUploads, float64(st.Snapshots.Uploading), "uploading")
	gauge(defSnapshotUploads, float64(st.Snapshots.Uploaded), "uploaded")
	gauge(defSnapshotUploads, float64(st.Snapshots.Failed), "failed")
	gauge(defSnapshotBytes, float64(st.Snapshots.Bytes))
	gauge(defSnapshotCap, float64(st.Snapshots.CapBytes))
	gauge(defHostCPUs, float64(st.Capacity.CPUs))
	gauge(defHostMemory, float64(st.Capacity.MemoryBytes))
	gauge(defHostMemoryAvailable, float64(st.Capacity.MemoryAvailableBytes))
	gauge(defHostDisk, float64(st.Capacity.DiskBytes))
	gauge(defHostDiskFree, float64(st.Capacity.DiskFreeBytes))
	gauge(defScrape, time.Duration(c.last.Load()).Seconds())
	c.last.Store(int64(time.Since(t0)))
}
