package daemon

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/manager"
	"github.com/cellfork/cellfork/internal/metrics"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
)

// version is the build's module version ("(devel)" from a source tree).
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "unknown"
}

// templateLabel is a sandbox's template as a metric label: a template's
// canonical name, or "snapshot" for one created from a snapshot (ids and
// names of snapshots are unbounded).
func templateLabel(id string) string {
	if name, err := template.Resolve(id); err == nil {
		return name
	}
	return "snapshot"
}

// imageKind says what a checkpoint image directory is, from where the
// manager puts it (a temporary name beside its final one while written).
func imageKind(dir string) string {
	switch filepath.Base(filepath.Dir(dir)) {
	case "snapshots":
		return metrics.ImageSnapshot
	case "forks":
		return metrics.ImageFork
	case "paused":
		return metrics.ImagePaused
	}
	if strings.HasPrefix(filepath.Base(dir), "warm-") {
		return metrics.ImageTemplate
	}
	return metrics.ImageOther
}

// hostSource reports the host's levels from the manager, the snapshot
// records and the host. Safe for concurrent use.
type hostSource struct {
	m       *manager.Manager
	dataDir string

	mu        sync.Mutex // guards the cached snapshot usage
	snapAt    time.Time
	snapUsage metrics.SnapshotUsage
}

// snapshotTTL is how long the snapshot usage (a store query) is reused.
const snapshotTTL = 5 * time.Second

func (h *hostSource) Stats(ctx context.Context) metrics.Stats {
	ms := h.m.Stats(ctx)
	st := metrics.Stats{
		Sandboxes: make([]metrics.Sandbox, len(ms.Sandboxes)),
		Pool: metrics.Pool{Ready: ms.PoolReady, ReadyTarget: ms.PoolReadyTarget, Shells: ms.PoolShells, ShellTarget: ms.PoolShellTarget,
			Standbys: ms.Standbys, StandbysReady: ms.StandbysReady, StandbyMax: ms.StandbyMax},
		Admission: metrics.Admission{Running: ms.StartsRunning, Waiting: ms.StartsWaiting, Slots: ms.StartSlots, QueueCap: ms.StartQueue},
		Snapshots: h.snapshots(ctx),
		Capacity:  h.capacity(),
	}
	for i, sb := range ms.Sandboxes {
		st.Sandboxes[i] = metrics.Sandbox{State: string(sb.State), Template: templateLabel(sb.TemplateID),
			CPUs: sb.CPUCount, MemoryBytes: int64(sb.MemoryMB) << 20, OnDisk: sb.OnDisk}
	}
	return st
}

func (h *hostSource) snapshots(ctx context.Context) metrics.SnapshotUsage {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.snapAt) < snapshotTTL {
		return h.snapUsage
	}
	u, err := h.m.SnapshotUsage(ctx)
	if err != nil {
		return h.snapUsage // the last known
	}
	h.snapAt, h.snapUsage = time.Now(), metrics.SnapshotUsage{Count: u.Count, Bytes: u.TotalBytes, CapBytes: u.CapBytes,
		Uploading: u.Uploads[sandbox.UploadPending], Uploaded: u.Uploads[sandbox.UploadDone], Failed: u.Uploads[sandbox.UploadFailed]}
	return h.snapUsage
}

func (h *hostSource) capacity() metrics.Capacity {
	c := metrics.Capacity{CPUs: runtime.NumCPU()}
	c.MemoryBytes, c.MemoryAvailableBytes = meminfo()
	var fs syscall.Statfs_t
	if syscall.Statfs(h.dataDir, &fs) == nil {
		c.DiskBytes, c.DiskFreeBytes = int64(fs.Blocks)*fs.Bsize, int64(fs.Bavail)*fs.Bsize
	}
	return c
}

// meminfo reads the host's total and available memory.
func meminfo() (total, available int64) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() && (total == 0 || available == 0) {
		name, rest, _ := strings.Cut(s.Text(), ":")
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[0], 10, 64)
		switch name {
		case "MemTotal":
			total = kb << 10
		case "MemAvailable":
			available = kb << 10
		}
	}
	return total, available
}

// egressReader reads every box's refused egress for the sampler.
func egressReader(m *manager.Manager) metrics.EgressReader {
	return func(ctx context.Context) map[string]metrics.EgressCounts {
		in := m.EgressDenied(ctx)
		out := make(map[string]metrics.EgressCounts, len(in))
		for rid, d := range in {
			out[rid] = metrics.EgressCounts{Firewall: d.Firewall, Proxy: d.Proxy, DNS: d.DNS}
		}
		return out
	}
}

// egressInterval is how often refused egress is sampled.
const egressInterval = 10 * time.Second

// serveMetrics serves GET /metrics, without a key, on its own address
// (--metrics-addr: bind it where only the scraper reaches) until ctx ends.
func serveMetrics(ctx context.Context, addr string, h http.Handler, log *slog.Logger) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() { _ = srv.Serve(ln) }()
	context.AfterFunc(ctx, func() { srv.Close() })
	return ln.Addr(), nil
}
