package manager

import (
	"context"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// Metrics samples the sandbox now. CPU use is averaged since the previous
// sample (or since start).
func (m *Manager) Metrics(ctx context.Context, id string) (sandbox.Metric, error) {
	l, err := m.lookup(id)
	if err != nil {
		return sandbox.Metric{}, err
	}
	l.mu.Lock()
	rec, b := cloneRecord(l.rec), l.box
	l.mu.Unlock()
	if b == nil { // paused on disk: uses no CPU or memory
		return sandbox.Metric{At: time.Now().UTC(), CPUCount: rec.CPUCount, MemTotal: uint64(rec.MemoryMB) << 20,
			DiskTotal: uint64(rec.DiskSizeMB) << 20}, nil
	}
	st, err := m.boxes.Stats(ctx, b)
	if err != nil {
		return sandbox.Metric{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	since := l.lastAt
	if since.IsZero() {
		since = rec.StartedAt
	}
	pct := 0.0
	if wall := now.Sub(since); wall > 0 {
		pct = 100 * float64(st.CPUUsage-l.lastCPU) / float64(wall) / float64(rec.CPUCount)
	}
	l.lastCPU, l.lastAt = st.CPUUsage, now
	total := uint64(rec.MemoryMB) << 20
	return sandbox.Metric{
		At: now.UTC(), CPUCount: rec.CPUCount, CPUUsedPct: min(max(pct, 0), 100),
		MemUsed: st.MemoryBytes, MemTotal: total, MemCache: st.MemoryCache,
		// The root overlay lives in sandbox memory: disk is memory.
		DiskUsed: st.MemoryCache, DiskTotal: uint64(rec.DiskSizeMB) << 20,
	}, nil
}
