package manager

import (
	"context"
	"time"
)

// Metric is one resource-usage sample of a sandbox.
type Metric struct {
	At         time.Time
	CPUCount   int
	CPUUsedPct float64
	MemUsed    uint64
	MemTotal   uint64
	MemCache   uint64
	DiskUsed   uint64
	DiskTotal  uint64
}

// Metrics samples the sandbox now. CPU use is averaged since the previous
// sample (or since start).
func (m *Manager) Metrics(ctx context.Context, id string) (Metric, error) {
	l, err := m.lookup(id)
	if err != nil {
		return Metric{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.box == nil { // paused on disk: uses no CPU or memory
		return Metric{At: time.Now().UTC(), CPUCount: l.rec.CPUCount, MemTotal: uint64(l.rec.MemoryMB) << 20,
			DiskTotal: uint64(l.rec.DiskSizeMB) << 20}, nil
	}
	st, err := m.rt.Stats(ctx, l.rec.RuntimeID)
	if err != nil {
		return Metric{}, err
	}
	now := time.Now()
	since := l.lastAt
	if since.IsZero() {
		since = l.rec.StartedAt
	}
	pct := 0.0
	if wall := now.Sub(since); wall > 0 {
		pct = 100 * float64(st.CPUUsage-l.lastCPU) / float64(wall) / float64(l.rec.CPUCount)
	}
	l.lastCPU, l.lastAt = st.CPUUsage, now
	total := uint64(l.rec.MemoryMB) << 20
	return Metric{
		At: now.UTC(), CPUCount: l.rec.CPUCount, CPUUsedPct: min(max(pct, 0), 100),
		MemUsed: st.MemoryBytes, MemTotal: total, MemCache: st.MemoryCache,
		// The root overlay lives in sandbox memory: disk is memory.
		DiskUsed: st.MemoryCache, DiskTotal: uint64(l.rec.DiskSizeMB) << 20,
	}, nil
}
