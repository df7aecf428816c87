package metrics

import "github.com/prometheus/client_golang/prometheus"

// Every metric cellfork exports is named here, with its help text and
// labels; docs/operations.md describes each one and deploy/grafana uses
// them. Label values are always from a small fixed set (operations,
// phases, templates, reasons): never a sandbox or snapshot id.

const namespace = "cellfork"

// def names one metric family.
type def struct {
	name   string // without the namespace
	help   string
	labels []string
}

func (d def) fqName() string { return prometheus.BuildFQName(namespace, "", d.name) }

func (d def) desc() *prometheus.Desc {
	return prometheus.NewDesc(d.fqName(), d.help, d.labels, nil)
}

func (d def) counter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: d.name, Help: d.help}, d.labels)
}

func (d def) gauge() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: d.name, Help: d.help}, d.labels)
}

func (d def) histogram(buckets []float64) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: d.name, Help: d.help, Buckets: buckets}, d.labels)
}

// LatencyBuckets (seconds) span a pause (about 1.5 ms) and a pool
// hand-off (a few ms) to a cold boot or a large checkpoint (seconds). Few
// buckets keep a scrape small: each is a line per series.
var LatencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Host (daemon) metrics: read from the manager at scrape time.
var (
	defSandboxes = def{"sandboxes", "Sandboxes by state (running, paused) and template (a built-in or custom template's name, or \"snapshot\" for sandboxes created from a snapshot).",
		[]string{"state", "template"}}
	defSandboxesPausedOnDisk = def{"sandboxes_paused_on_disk", "Paused sandboxes whose state was written to disk (holding no memory).", nil}
	defAllocatedCPUs         = def{"sandbox_cpus_allocated", "CPUs allocated to running sandboxes (the sum of their cpuCount).", nil}
	defAllocatedMemory       = def{"sandbox_memory_allocated_bytes", "Memory allocated to running sandboxes (the sum of their memoryMB).", nil}
	defPoolReady             = def{"pool_ready", "Sandboxes kept restored and ready to hand out, by template.", []string{"template"}}
	defPoolReadyTarget       = def{"pool_ready_target", "Ready sandboxes the pool keeps per template (--pool-ready).", nil}
	defPoolShells            = def{"pool_shells", "Prepared shells (sandboxes running nothing yet) kept to restore snapshots, forks and rollbacks into.", nil}
	defPoolShellsTarget      = def{"pool_shells_target", "Shells the pool keeps (--pool-shells).", nil}
	defStandbys              = def{"standby_snapshots", "Snapshots that keep a standby sandbox, by state: ready (restored and frozen now) or pending (being refilled).", []string{"state"}}
	defStandbysMax           = def{"standby_snapshots_max", "Most snapshots that keep a standby (--standby-snapshots).", nil}
	defStartsRunning         = def{"admission_starts_running", "Sandbox starts (boots, restores) holding a start slot now.", nil}
	defStartsWaiting         = def{"admission_queue_length", "Sandbox starts waiting in line for a start slot.", nil}
	defStartSlots            = def{"admission_slots", "Start slots (--start-concurrency).", nil}
	defStartQueue            = def{"admission_queue_capacity", "Starts that may wait before requests get 503 (--start-queue).", nil}
	defSnapshots             = def{"snapshots", "Snapshots recorded.", nil}
	defSnapshotUploads       = def{"snapshot_uploads", "Snapshots by where their image is in the chunk store (--store): uploading, uploaded or failed (for good).", []string{"state"}}
	defSnapshotBytes         = def{"snapshot_disk_bytes", "Disk used by snapshot images.", nil}
	defSnapshotCap           = def{"snapshot_disk_cap_bytes", "Snapshot disk use past which new snapshots are refused with 507 (--snapshot-cap-mb; 0 = no cap).", nil}
	defHostCPUs              = def{"host_cpus", "CPUs of the host.", nil}
	defHostMemory            = def{"host_memory_bytes", "Memory of the host.", nil}
	defHostMemoryAvailable   = def{"host_memory_available_bytes", "Memory of the host available for new work (MemAvailable).", nil}
	defHostDiskFree          = def{"host_disk_free_bytes", "Free disk space on the data directory's filesystem.", nil}
	defHostDisk              = def{"host_disk_bytes", "Size of the data directory's filesystem.", nil}
	defBuildInfo             = def{"build_info", "Always 1; the labels say which build runs.", []string{"version", "goversion"}}
)

// Host (daemon) metrics: counted as events happen.
var (
	defRequests         = def{"requests_total", "HTTP requests answered, by operation (create, fork, run_code, ...) and status code.", []string{"operation", "code"}}
	defRequestsInFlight = def{"requests_in_flight", "HTTP requests being served, by plane (control, data).", []string{"plane"}}
	defOperation        = def{"operation_duration_seconds", "Latency of each operation, in total and by phase (the phases of its Server-Timing header).", []string{"operation", "phase"}}
	defCreates          = def{"sandbox_creates_total", "Sandboxes created, by boot mode (pool, standby, restore, boot, fork) and template.", []string{"boot_mode", "template"}}
	defAdmissionReject  = def{"admission_rejections_total", "Requests refused with 503 because no start slot came free in time or the line was full, by operation.", []string{"operation"}}
	defRuntimeOps       = def{"runtime_operations_total", "Calls to the sandbox runtime (gVisor), by operation (start, prepare, restore, checkpoint, export_rootfs, pause, resume, destroy) and result (ok, error).", []string{"op", "result"}}
	defRuntimeLatency   = def{"runtime_operation_duration_seconds", "Latency of calls to the sandbox runtime, by operation.", []string{"op"}}
	defRestores         = def{"restores_total", "Checkpoint images restored, by source (template, snapshot, fork, paused) and trigger (request, background).", []string{"source", "trigger"}}
	defRestoreBytes     = def{"restore_bytes_total", "Bytes of checkpoint images restored, by source.", []string{"source"}}
	defCheckpoints      = def{"checkpoints_total", "Checkpoint images written, by kind (snapshot, fork, pause, template; filesystem: a filesystem-only pause's tar of the root filesystem's changes) and trigger (request, background).", []string{"kind", "trigger"}}
	defCheckpointBytes  = def{"checkpoint_bytes_total", "Bytes of checkpoint images written, by kind.", []string{"kind"}}
	defPoolRefills      = def{"pool_refills_total", "Background refills of the pool, by kind (ready, shell, standby) and result (ok, error).", []string{"kind", "result"}}
	defEgressDenied     = def{"egress_denied_total", "Sandbox egress refused by the network policy, by reason: firewall (an address or range the rules refuse, or internet off), proxy (a name no domain rule allows), dns (a name the resolver refused).", []string{"reason"}}
	defAgentErrors      = def{"agent_errors_total", "Data-plane requests to a sandbox's agent (envd, code interpreter) that failed, by port and reason (unreachable, refused, gone, status_5xx).", []string{"port", "reason"}}
	defAuthFailures     = def{"auth_failures_total", "Requests refused for authentication, by reason (missing_key, invalid_key, missing_token, invalid_token, invalid_signature).", []string{"reason"}}
	defScrape           = def{"scrape_duration_seconds", "Time taken to gather the host's levels for the previous scrape.", nil}
)

// Gateway metrics (cluster mode): defined here, registered by the gateway
// (NewGateway). It also counts cellfork_auth_failures_total.
var (
	defGatewayRoute    = def{"gateway_route_duration_seconds", "Time the gateway takes to route a data-plane request to its host (the host's lookup from the id and the token check, before forwarding), by plane and outcome (ok, unreachable: the host did not answer).", []string{"plane", "outcome"}}
	defGatewayRequests = def{"gateway_requests_total", "Requests the gateway answered, by plane and status code.", []string{"plane", "code"}}
	defGatewayHosts    = def{"gateway_hosts", "Hosts the gateway knows in its region, by region and state (active, cordoned, draining, lost).", []string{"region", "state"}}
)

// allDefs are every metric above, for the tests that keep
// docs/operations.md and deploy/grafana in step with them.
var allDefs = []def{
	defSandboxes, defSandboxesPausedOnDisk, defAllocatedCPUs, defAllocatedMemory, defPoolReady, defPoolReadyTarget,
	defPoolShells, defPoolShellsTarget, defStandbys, defStandbysMax, defStartsRunning, defStartsWaiting, defStartSlots,
	defStartQueue, defSnapshots, defSnapshotUploads, defSnapshotBytes, defSnapshotCap, defHostCPUs, defHostMemory, defHostMemoryAvailable,
	defHostDiskFree, defHostDisk, defBuildInfo,
	defRequests, defRequestsInFlight, defOperation, defCreates, defAdmissionReject, defRuntimeOps, defRuntimeLatency,
	defRestores, defRestoreBytes, defCheckpoints, defCheckpointBytes, defPoolRefills, defEgressDenied, defAgentErrors,
	defAuthFailures, defScrape,
	defGatewayRoute, defGatewayRequests, defGatewayHosts,
}
