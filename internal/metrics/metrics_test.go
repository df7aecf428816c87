package metrics

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// fakeSource reports n sandboxes over three templates, a third paused.
type fakeSource struct{ st Stats }

func newFakeSource(n int) *fakeSource {
	st := Stats{
		Pool:      Pool{Ready: map[string]int{"base": 2, "code-interpreter-v1": 1}, ReadyTarget: 2, Shells: 1, ShellTarget: 2, Standbys: 2, StandbysReady: 1, StandbyMax: 2},
		Admission: Admission{Running: 1, Waiting: 3, Slots: 4, QueueCap: 256},
		Snapshots: SnapshotUsage{Count: 7, Bytes: 7 << 30, CapBytes: 20 << 30, Uploading: 1, Uploaded: 5, Failed: 1},
		Capacity:  Capacity{CPUs: 16, MemoryBytes: 64 << 30, MemoryAvailableBytes: 40 << 30, DiskBytes: 1 << 40, DiskFreeBytes: 1 << 39},
	}
	templates := []string{"base", "code-interpreter-v1", "snapshot"}
	for i := range n {
		sb := Sandbox{State: "running", Template: templates[i%3], CPUs: 1, MemoryBytes: 1 << 30}
		if i%3 == 0 {
			sb.State, sb.OnDisk = "paused", i%2 == 0
		}
		st.Sandboxes = append(st.Sandboxes, sb)
	}
	return &fakeSource{st: st}
}

func (f *fakeSource) Stats(context.Context) Stats { return f.st }

func scrape(t testing.TB, h *Host) string {
	t.Helper()
	rr := httptest.NewRecorder()
	h.Handler().ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rr.Code != http.StatusOK {
		t.Fatalf("scrape: %d %s", rr.Code, rr.Body)
	}
	return rr.Body.String()
}

func hasLine(t *testing.T, body, line string) {
	t.Helper()
	for _, l := range strings.Split(body, "\n") {
		if l == line {
			return
		}
	}
	t.Errorf("scrape lacks %q", line)
}

func TestLevels(t *testing.T) {
	h := NewHost(Config{Source: newFakeSource(6), Version: "test"})
	body := scrape(t, h)
	for _, l := range []string{
		`cellfork_sandboxes{state="running",template="code-interpreter-v1"} 2`,
		`cellfork_sandboxes{state="paused",template="base"} 2`,
		`cellfork_sandboxes{state="paused",template="snapshot"} 0`, // both states of every template
		`cellfork_sandboxes_paused_on_disk 1`,
		`cellfork_sandbox_cpus_allocated 4`,
		`cellfork_sandbox_memory_allocated_bytes 4.294967296e+09`,
		`cellfork_pool_ready{template="base"} 2`,
		`cellfork_pool_shells 1`,
		`cellfork_standby_snapshots{state="ready"} 1`,
		`cellfork_standby_snapshots{state="pending"} 1`,
		`cellfork_admission_queue_length 3`,
		`cellfork_admission_slots 4`,
		`cellfork_snapshot_disk_bytes 7.516192768e+09`,
		`cellfork_snapshot_uploads{state="uploading"} 1`,
		`cellfork_snapshot_uploads{state="uploaded"} 5`,
		`cellfork_snapshot_uploads{state="failed"} 1`,
		`cellfork_host_cpus 16`,
		`cellfork_egress_denied_total{reason="dns"} 0`,
		`cellfork_build_info{goversion="` + runtime.Version() + `",version="test"} 1`,
	} {
		hasLine(t, body, l)
	}
	if !strings.Contains(body, "go_goroutines") || !strings.Contains(body, "process_cpu_seconds_total") {
		t.Error("the Go runtime's and the process's metrics are missing")
	}
}

// TestLint checks every family against Prometheus's naming conventions
// (units, _total on counters, help text).
func TestLint(t *testing.T) {
	h := NewHost(Config{Source: newFakeSource(3), Version: "test"})
	h.ObserveRequest("create", 201, nil, time.Millisecond)
	h.Created("pool", "base")
	h.AgentError("envd", "unreachable")
	h.AuthFailure("invalid_key")
	g := NewGateway(h.Registry()) // the gateway's names join the daemon's
	g.Routed("data", "ok", time.Millisecond)
	g.Answered("data", 200)
	g.SetHosts(func() map[[2]string]int { return map[[2]string]int{{"eu", "ready"}: 3} })
	problems, err := testutil.GatherAndLint(h.Registry())
	if err != nil {
		t.Fatal(err)
	}
	hasLine(t, scrape(t, h), `cellfork_gateway_hosts{region="eu",state="ready"} 3`)
	var nilGateway *Gateway // a gateway without metrics counts nothing
	nilGateway.Routed("data", "ok", time.Millisecond)
	nilGateway.AuthFailure("missing_key")
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestObserveRequest(t *testing.T) {
	h := NewHost(Config{Version: "test", TemplateLabel: func(id string) string {
		if id == "base" || id == "code-interpreter-v1" {
			return id
		}
		return "snapshot"
	}})
	ctx, rec := timing.With(context.Background())
	timing.Add(ctx, "restore", 180*time.Millisecond)
	timing.Add(ctx, "init", 2*time.Millisecond)
	h.ObserveRequest("create", 201, rec, 200*time.Millisecond)
	h.ObserveRequest("create", 503, nil, time.Second)
	h.Created("restore", "k3j2h4g5f6d7s8a9p0o1") // a snapshot id is not a label value
	body := scrape(t, h)
	for _, l := range []string{
		`cellfork_requests_total{code="201",operation="create"} 1`,
		`cellfork_requests_total{code="503",operation="create"} 1`,
		`cellfork_admission_rejections_total{operation="create"} 1`,
		`cellfork_operation_duration_seconds_count{operation="create",phase="total"} 2`,
		`cellfork_operation_duration_seconds_count{operation="create",phase="restore"} 1`,
		`cellfork_operation_duration_seconds_bucket{operation="create",phase="restore",le="0.25"} 1`,
		`cellfork_operation_duration_seconds_bucket{operation="create",phase="restore",le="0.1"} 0`,
		`cellfork_sandbox_creates_total{boot_mode="restore",template="snapshot"} 1`,
	} {
		hasLine(t, body, l)
	}
	done := h.InFlight("data")
	hasLine(t, scrape(t, h), `cellfork_requests_in_flight{plane="data"} 1`)
	done()
	hasLine(t, scrape(t, h), `cellfork_requests_in_flight{plane="data"} 0`)
}

func TestEgress(t *testing.T) {
	h := NewHost(Config{Version: "test"})
	h.addEgress(nil, map[string]EgressCounts{"a": {Firewall: 3, DNS: 1}})
	h.addEgress(map[string]EgressCounts{"a": {Firewall: 3, DNS: 1}},
		map[string]EgressCounts{"a": {Firewall: 5, DNS: 1, Proxy: 2}, "b": {Firewall: 1}}) // b is new; a grew
	body := scrape(t, h)
	hasLine(t, body, `cellfork_egress_denied_total{reason="firewall"} 6`)
	hasLine(t, body, `cellfork_egress_denied_total{reason="proxy"} 2`)
	hasLine(t, body, `cellfork_egress_denied_total{reason="dns"} 1`)

	// The sampler reads in the background until its context ends.
	ctx, cancel := context.WithCancel(context.Background())
	reads := make(chan struct{}, 10)
	n := uint64(0)
	done := make(chan struct{})
	go func() {
		h.SampleEgress(ctx, time.Millisecond, func(context.Context) map[string]EgressCounts {
			n++
			select {
			case reads <- struct{}{}:
			default:
			}
			return map[string]EgressCounts{"a": {Proxy: n}}
		})
		close(done)
	}()
	for range 3 {
		<-reads
	}
	cancel()
	<-done
	if v := testutil.ToFloat64(h.egressDenied.WithLabelValues("proxy")); v < 4 {
		t.Errorf("sampler added %v proxy refusals, want at least 2 more than 2", v)
	}
}

// fakeRuntime writes a 1 KiB checkpoint and fails what it is told to.
type fakeRuntime struct {
	sandbox.Runtime
	fail bool
}

func (f *fakeRuntime) Checkpoint(_ context.Context, _, dir string, _ bool) error {
	return os.WriteFile(filepath.Join(dir, "pages.img"), make([]byte, 1024), 0o600)
}

func (f *fakeRuntime) Restore(context.Context, sandbox.Spec, string, bool) error {
	if f.fail {
		return fmt.Errorf("restore failed")
	}
	return nil
}

func (f *fakeRuntime) Prepare(context.Context, sandbox.Spec) error { return nil }

func (f *fakeRuntime) ExportRootfs(_ context.Context, _, path string) error {
	return os.WriteFile(path, make([]byte, 512), 0o600)
}

func TestRuntime(t *testing.T) {
	h := NewHost(Config{Version: "test"})
	dir := t.TempDir()
	snap := filepath.Join(dir, "snapshots", "s1")
	if err := os.MkdirAll(snap, 0o700); err != nil {
		t.Fatal(err)
	}
	kind := func(d string) string {
		switch filepath.Base(filepath.Dir(d)) {
		case "snapshots":
			return ImageSnapshot
		case "warm":
			return ImageTemplate
		}
		return ImageOther
	}
	fr := &fakeRuntime{}
	rt := h.Runtime(fr, kind)
	reqCtx, _ := timing.With(context.Background())
	if err := rt.Checkpoint(reqCtx, "rid", snap, true); err != nil {
		t.Fatal(err)
	}
	_ = rt.Restore(reqCtx, sandbox.Spec{}, snap, true)                                      // a create from the snapshot
	_ = rt.Restore(context.Background(), sandbox.Spec{}, snap, true)                        // a standby's fill
	_ = rt.Prepare(context.Background(), sandbox.Spec{})                                    // a shell's
	if err := rt.ExportRootfs(reqCtx, "rid", filepath.Join(dir, "upper.tar")); err != nil { // a filesystem pause
		t.Fatal(err)
	}
	fr.fail = true
	_ = rt.Restore(context.Background(), sandbox.Spec{}, filepath.Join(dir, "warm", "w"), true) // a failed ready refill
	body := scrape(t, h)
	for _, l := range []string{
		`cellfork_checkpoints_total{kind="snapshot",trigger="request"} 1`,
		`cellfork_checkpoint_bytes_total{kind="snapshot"} 1024`,
		`cellfork_restores_total{source="snapshot",trigger="request"} 1`,
		`cellfork_restores_total{source="snapshot",trigger="background"} 1`,
		`cellfork_restore_bytes_total{source="snapshot"} 2048`,
		`cellfork_pool_refills_total{kind="standby",result="ok"} 1`,
		`cellfork_pool_refills_total{kind="shell",result="ok"} 1`,
		`cellfork_pool_refills_total{kind="ready",result="error"} 1`,
		`cellfork_runtime_operations_total{op="restore",result="error"} 1`,
		`cellfork_runtime_operations_total{op="restore",result="ok"} 2`,
		`cellfork_runtime_operation_duration_seconds_count{op="checkpoint"} 1`,
		`cellfork_checkpoints_total{kind="filesystem",trigger="request"} 1`,
		`cellfork_checkpoint_bytes_total{kind="filesystem"} 512`,
	} {
		hasLine(t, body, l)
	}
}

// benchPhases are the operations and phases a busy daemon's histograms
// hold (each operation's Server-Timing phases), plus two operations per
// phase more than it has, to err on the heavy side.
var benchPhases = map[string][]string{
	"create":   {"resolve", "queue", "netns", "bundle", "restore", "agent", "policy", "store", "init", "resume"},
	"fork":     {"checkpoint", "children", "queue", "netns", "bundle", "restore", "agent", "policy", "store", "init"},
	"rollback": {"queue", "netns", "bundle", "restore", "agent", "policy", "store", "init", "resume"},
	"snapshot": {"checkpoint", "store"}, "pause": {"pause", "spill", "checkpoint"}, "connect": {"resume", "restore", "agent", "init"},
	"resume": {"resume", "restore", "agent", "init"}, "merge": {"policy", "store", "init"}, "kill": {"destroy"},
	"list": nil, "get": nil, "metrics": nil, "timeout": nil, "network": nil, "snapshots": nil, "host": nil,
	"run_code": {"route", "upstream"}, "process": {"route", "upstream"}, "filesystem": {"route", "upstream"},
	"files": {"route", "upstream"}, "envd": {"route", "upstream"}, "code_interpreter": {"route", "upstream"}, "port": {"route", "upstream"},
}

// BenchmarkScrape is one full scrape (gather, encode, write) with 1,000
// sandboxes behind the Source and every operation's histograms filled.
// docs/benchmarks.md has its numbers.
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{0, 1000, 10000} {
		b.Run(fmt.Sprintf("sandboxes=%d", n), func(b *testing.B) {
			h := NewHost(Config{Source: newFakeSource(n), Version: "bench"})
			for op, phases := range benchPhases {
				h.ObserveRequest(op, 200, nil, time.Millisecond)
				h.ObserveRequest(op, 404, nil, time.Millisecond)
				for _, ph := range append(phases, "extra1", "extra2") {
					h.operation.WithLabelValues(op, ph).Observe(0.01)
				}
			}
			hdl := h.Handler()
			req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			var size int
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for b.Loop() {
				rr := httptest.NewRecorder()
				hdl.ServeHTTP(rr, req)
				size = rr.Body.Len()
			}
			// CPU time as well as wall time: on a shared machine the wall
			// time includes waiting for a core.
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N)/1000, "cpu-ms/scrape")
			b.ReportMetric(float64(size), "bytes/scrape")
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/scrape")
		})
	}
}

// cpuTime is the CPU time this process has used (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
