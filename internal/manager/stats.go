package manager

import (
	"context"
	"maps"
	"slices"

	"github.com/cellfork/cellfork/internal/sandbox"
)

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
	m.mu.Lock()
	lives := slices.Collect(maps.Values(m.live))
	m.mu.Unlock()
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

// EgressDenials are a box's refused egress so far, by where it was
// refused.
type EgressDenials struct {
	Firewall uint64 // the router's rules (addresses, ranges, internet off)
	Proxy    uint64 // the domain-rule proxy (a name no rule allows)
	DNS      uint64 // the resolver (REFUSED: a name no rule allows)
}

// deniedByReason is what a network that tells refusals apart offers
// (netns does); others count them all as the firewall's.
type deniedByReason interface {
	DeniedByReason() (firewall, proxy, dns uint64, err error)
}

// EgressDenied returns the refusal counts of every box a sandbox runs in,
// by runtime id (a rollback's new box starts from zero). It reads each
// box's counters from the kernel: call it from a background sampler, not
// on a request's path.
func (m *Manager) EgressDenied(context.Context) map[string]EgressDenials {
	m.mu.Lock()
	lives := slices.Collect(maps.Values(m.live))
	m.mu.Unlock()
	out := make(map[string]EgressDenials, len(lives))
	for _, l := range lives {
		l.mu.Lock()
		b := l.box
		l.mu.Unlock()
		if b == nil {
			continue
		}
		var d EgressDenials
		var err error
		if dr, ok := b.Net.(deniedByReason); ok {
			d.Firewall, d.Proxy, d.DNS, err = dr.DeniedByReason()
		} else {
			d.Firewall, err = b.Net.Denied()
		}
		if err == nil { // else destroyed meanwhile
			out[b.RID] = d
		}
	}
	return out
}
