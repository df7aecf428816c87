package manager

import (
	"context"
	"time"

	"github.com/cellfork/cellfork/internal/samples"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// What the sandboxes use and hold, read for callers, metrics and the
// cluster. The samples themselves are internal/samples'.

// Metrics returns the sandbox's samples between from and to (zero: its
// start, and now), oldest first. When the range reaches now and the last
// sample is older than a fifth of a bucket, a sample is taken now.
func (m *Manager) Metrics(ctx context.Context, id string, from, to time.Time) ([]sandbox.Metric, error) {
	l, err := m.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	of := sampled(l)
	l.mu.Unlock()
	return m.samples.Range(ctx, of, from, to)
}

// sampled is what a sample needs of l. Caller holds l.mu.
func sampled(l *Live) samples.Of {
	return samples.Of{ID: l.rec.ID, Box: l.box, StartedAt: l.rec.StartedAt, CPUCount: l.rec.CPUCount,
		MemoryMB: l.rec.MemoryMB, DiskMB: l.rec.DiskSizeMB}
}

// running lists what the sampler samples every bucket: the running
// sandboxes.
func (m *Manager) running() []samples.Of {
	var out []samples.Of
	for _, l := range m.lives() {
		l.mu.Lock()
		if l.phase == running {
			out = append(out, sampled(l))
		}
		l.mu.Unlock()
	}
	return out
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

// Stats is a cheap summary of what the manager holds, for metrics and the
// dashboard: it takes each lock briefly and copies no records.
type Stats struct {
	Sandboxes []SandboxStat
	// Pool: ready sandboxes per template and shells, with their targets.
	PoolReady       map[string]int
	PoolReadyTarget int
	PoolShells      int
	PoolShellTarget int
	// Standbys: snapshots that keep one (StandbyMax at most), and how many
	// of them have it restored and frozen now.
	Standbys      int
	StandbysReady int
	StandbyMax    int
	// Admission: starts running and waiting, and the bounds on both.
	StartsRunning int
	StartsWaiting int
	StartSlots    int
	StartQueue    int
}

// SandboxStat is one sandbox's part of Stats.
type SandboxStat struct {
	State      sandbox.State
	TemplateID string // as the caller asked for it
	CPUCount   int
	MemoryMB   int
	OnDisk     bool // paused with its state on disk (no memory held)
}

// Stats returns the manager's current levels.
func (m *Manager) Stats(context.Context) Stats {
	lives := m.lives()
	st := Stats{Sandboxes: make([]SandboxStat, 0, len(lives))}
	for _, l := range lives {
		l.mu.Lock()
		if l.phase != dead {
			st.Sandboxes = append(st.Sandboxes, SandboxStat{State: l.rec.State, TemplateID: l.rec.TemplateID,
				CPUCount: l.rec.CPUCount, MemoryMB: l.rec.MemoryMB, OnDisk: l.phase == spilled})
		}
		l.mu.Unlock()
	}
	ps := m.pool.Stats()
	st.PoolReady, st.PoolShells = ps.Ready, ps.Shells
	st.PoolReadyTarget, st.PoolShellTarget, st.StandbyMax = m.cfg.PoolReady, m.cfg.PoolShells, m.cfg.StandbySnapshots
	st.Standbys = len(ps.Standbys)
	for _, ready := range ps.Standbys {
		st.StandbysReady += ready
	}
	st.StartsRunning, st.StartsWaiting, st.StartSlots, st.StartQueue = m.adm.Levels()
	return st
}

// EgressDenied returns the refusal counts of every box a sandbox runs in,
// by runtime id (a rollback's new box starts from zero). It reads each
// box's counters from the kernel: call it from a background sampler, not
// on a request's path.
func (m *Manager) EgressDenied(context.Context) map[string]samples.EgressDenials {
	lives := m.lives()
	out := make(map[string]samples.EgressDenials, len(lives))
	for _, l := range lives {
		l.mu.Lock()
		b := l.box
		l.mu.Unlock()
		if b == nil {
			continue
		}
		if d, err := samples.Egress(b.Net); err == nil { // else destroyed meanwhile
			out[b.RID] = d
		}
	}
	return out
}
