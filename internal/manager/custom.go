package manager

import (
	"context"

	"github.com/cellfork/cellfork/internal/pool"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// The manager's side of custom templates (CustomTemplates, manager.go):
// their ready sandboxes, the root filesystems sandboxes need, and the
// boxes their builds run in.

// WarmCustom keeps ready sandboxes of a custom template in the pool (0:
// none; creates then restore its image, about as fast as a snapshot).
func (m *Manager) WarmCustom(t CustomTemplate, ready int) {
	m.pool.SetWarm(t.Key, pool.Warm{Rootfs: t.Rootfs, Image: t.Image, Limits: m.cfg.DefaultLimits.Over(t.Limits), Ready: &ready})
	m.snaps.Remember(t.Image)
}

// UnwarmCustom drops a custom template from the pool and destroys its
// ready sandboxes.
func (m *Manager) UnwarmCustom(key string) { m.pool.RemoveWarm(key) }

// RootfsInUse reports the root file systems that sandboxes (running or
// paused) and snapshots need: a template's root must outlive them.
func (m *Manager) RootfsInUse(ctx context.Context) (map[string]bool, error) {
	used := map[string]bool{}
	recs, err := m.st.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		used[rec.Rootfs] = true
	}
	sns, err := m.st.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, sn := range sns {
		used[sn.Rootfs] = true
	}
	return used, nil
}

// BootBuild starts a box for a template build (pool.BootBuild), with the
// default limits under those it asks for.
func (m *Manager) BootBuild(ctx context.Context, rootfs string, limits sandbox.Limits, writable bool, env ...string) (*pool.BuildBox, error) {
	return m.pool.BootBuild(ctx, rootfs, m.cfg.DefaultLimits.Over(limits), writable, env...)
}

// BootKey is what a warm image booted with limits freezes.
func (m *Manager) BootKey(limits sandbox.Limits) string {
	return m.boxes.BootKey(m.cfg.DefaultLimits.Over(limits).DiskMB)
}
