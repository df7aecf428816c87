package manager

import (
	"context"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// Metrics are sampled every metricsEvery (E2B's collection bucket) and kept
// for metricsKept, so that a range asks for history, as E2B's does.
const (
	metricsEvery = 5 * time.Second
	metricsKept  = time.Hour
)

// Metrics returns the sandbox's samples between from and to (zero: its
// start, and now), oldest first. When the range reaches now and the last
// sample is older than a bucket, a sample is taken now.
func (m *Manager) Metrics(ctx context.Context, id string, from, to time.Time) ([]sandbox.Metric, error) {
	l, err := m.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if to.IsZero() || to.After(now) {
		to = now
	}
	l.mu.Lock()
	if from.IsZero() {
		from = l.rec.StartedAt
	}
	last := time.Time{}
	if n := len(l.history); n > 0 {
		last = l.history[n-1].At
	}
	l.mu.Unlock()
	if !to.Before(now.Add(-metricsEvery)) && now.Sub(last) >= metricsEvery/5 {
		if err := m.sample(ctx, l); err != nil {
			return nil, err
		}
		to = time.Now() // the range reaches now: it takes the sample just taken
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []sandbox.Metric{}
	for _, s := range l.history {
		if !s.At.Before(from.Truncate(time.Second)) && !s.At.After(to) {
			out = append(out, s)
		}
	}
	return out, nil
}

// sample takes one sample of l now and keeps it. CPU use is averaged since
// the previous sample (or since start); a sandbox paused on disk uses no
// CPU or memory.
func (m *Manager) sample(ctx context.Context, l *Live) error {
	l.mu.Lock()
	rec, b, p := cloneRecord(l.rec), l.box, l.phase
	l.mu.Unlock()
	s := sandbox.Metric{At: time.Now().UTC(), CPUCount: rec.CPUCount, MemTotal: uint64(rec.MemoryMB) << 20,
		DiskTotal: uint64(rec.DiskSizeMB) << 20}
	var st sandbox.Stats
	if b != nil && p != dead {
		var err error
		if st, err = m.boxes.Stats(ctx, b); err != nil {
			return err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if b != nil {
		since := l.lastAt
		if since.IsZero() {
			since = rec.StartedAt
		}
		if wall := s.At.Sub(since); wall > 0 && st.CPUUsage >= l.lastCPU {
			s.CPUUsedPct = min(max(100*float64(st.CPUUsage-l.lastCPU)/float64(wall)/float64(rec.CPUCount), 0), 100)
		}
		l.lastCPU, l.lastAt = st.CPUUsage, s.At
		// The root overlay lives in sandbox memory: disk is memory.
		s.MemUsed, s.MemCache, s.DiskUsed = st.MemoryBytes, st.MemoryCache, st.MemoryCache
	}
	l.history = append(l.history, s)
	if cut := len(l.history) - int(metricsKept/metricsEvery); cut > 0 {
		l.history = append(l.history[:0:0], l.history[cut:]...)
	}
	return nil
}

// sampleLoop samples every running sandbox each metricsEvery until the
// manager closes.
func (m *Manager) sampleLoop() {
	t := time.NewTicker(metricsEvery)
	defer t.Stop()
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
		}
		for _, l := range m.lives() {
			l.mu.Lock()
			running := l.phase == running
			l.mu.Unlock()
			if running {
				_ = m.sample(context.Background(), l)
			}
		}
	}
}

// Usage is what the host's sandboxes hold: how many, the memory of those
// with a box, and starts waiting or running.
type Usage struct {
	Sandboxes int
	MemoryMB  int64
	Starting  int
}

// Usage reports what the host's sandboxes hold.
func (m *Manager) Usage() Usage {
	var u Usage
	for _, l := range m.lives() {
		l.mu.Lock()
		if l.phase != dead {
			u.Sandboxes++
			if l.box != nil {
				u.MemoryMB += int64(l.rec.MemoryMB)
			}
		}
		l.mu.Unlock()
	}
	u.Starting = m.adm.Pending()
	return u
}
