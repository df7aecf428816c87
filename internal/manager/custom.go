package manager

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/pool"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// The seam to custom templates (internal/templates): the manager resolves
// template ids it does not know through CustomTemplates, keeps ready
// sandboxes of the templates it is told to (WarmCustom), and starts the
// sandboxes template builds run in (BootBuild; the daemon adapts it to the
// builder's interface, so that the manager does not depend on the builder).

// CustomTemplate is a built template as the manager needs it.
type CustomTemplate struct {
	// Key names the build in the pool (one per build: a rebuild is a new
	// key, and sandboxes of the old one keep its root).
	Key    string
	Rootfs string
	Image  string // warm image: booted, start command running
	// Limits are its sandboxes' defaults; DiskMB is frozen in Image.
	Limits sandbox.Limits
}

// CustomTemplates resolves the ids of templates built at runtime.
type CustomTemplates interface {
	// ResolveTemplate returns the template id names ("name", "name:tag",
	// a template id), or an ErrNotFound error.
	ResolveTemplate(ctx context.Context, id string) (CustomTemplate, error)
	// LocalRoot returns this host's copy of root file system rootfs, which
	// a record from another host names (a custom template's root is at
	// another path on each host: this host's copy of the same build,
	// pulled for team if need be); another path as it is.
	LocalRoot(ctx context.Context, team, rootfs string) (string, error)
}

// SetCustomTemplates installs the resolver of custom templates. Call it
// before serving.
func (m *Manager) SetCustomTemplates(c CustomTemplates) { m.custom = c }

// resolveCustom maps id to a custom template's source; ok is false when id
// names none.
func (m *Manager) resolveCustom(ctx context.Context, id string) (source, bool, error) {
	if m.custom == nil {
		return source{}, false, nil
	}
	t, err := m.custom.ResolveTemplate(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return source{}, false, nil
	}
	if err != nil {
		return source{}, false, err
	}
	return source{template: t.Key, rootfs: t.Rootfs, image: t.Image, limits: m.cfg.DefaultLimits.Over(t.Limits), custom: id}, true, nil
}

// localRoot returns this host's copy of rootfs, the root file system a
// record from another host names (what: the record, for errors): a
// custom template's root maps to this host's copy of its build
// (CustomTemplates.LocalRoot); a built-in template's is the same path on
// every host. ErrFailedPrecondition if this host has none.
func (m *Manager) localRoot(ctx context.Context, team, what, rootfs string) (string, error) {
	if m.custom != nil {
		local, err := m.custom.LocalRoot(ctx, team, rootfs)
		if err != nil {
			return "", fmt.Errorf("%s: its template's root file system: %w", what, err)
		}
		rootfs = local
	}
	if _, err := os.Stat(rootfs); err != nil {
		return "", errdefs.New(errdefs.ErrFailedPrecondition, "%s: its template's root filesystem (%s) is not on this host", what, rootfs)
	}
	return rootfs, nil
}

// WarmCustom keeps ready sandboxes of a custom template in the pool (0:
// none; creates then restore its image, about as fast as a snapshot).
func (m *Manager) WarmCustom(t CustomTemplate, ready int) {
	m.pool.SetWarm(t.Key, pool.Warm{Rootfs: t.Rootfs, Image: t.Image, Limits: m.cfg.DefaultLimits.Over(t.Limits), Ready: &ready})
	m.remember(t.Image)
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

// BootBuild starts a box for a template build: a step's sandbox on its
// overlay (writable), or the finished template to warm. It takes a start
// slot while it boots, and gets the default network policy (builds fetch
// packages).
func (m *Manager) BootBuild(ctx context.Context, rootfs string, limits sandbox.Limits, writable bool, env ...string) (*BuildBox, error) {
	limits = m.cfg.DefaultLimits.Over(limits)
	release, err := m.adm.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	var b *box.Box
	if writable {
		b, err = m.boxes.BootWritable(ctx, rootfs, limits, env...)
	} else {
		b, err = m.boxes.Boot(ctx, rootfs, limits, "", env...)
	}
	if err != nil {
		return nil, err
	}
	cu := cleanup.Make(func() { m.boxes.Destroy(context.WithoutCancel(ctx), b) })
	defer cu.Clean()
	if err := m.boxes.SetPolicy(b, sandbox.DefaultNetwork); err != nil {
		return nil, err
	}
	cu.Release()
	return &BuildBox{m: m, b: b}, nil
}

// BootKey is what a warm image booted with limits freezes.
func (m *Manager) BootKey(limits sandbox.Limits) string {
	return m.boxes.BootKey(m.cfg.DefaultLimits.Over(limits).DiskMB)
}

// BuildBox is a box a template build runs in. Destroy it when done.
type BuildBox struct {
	m    *Manager
	b    *box.Box
	once sync.Once
}

// Transport reaches the box's ports ("http://sandbox:<port>").
func (x *BuildBox) Transport() http.RoundTripper { return x.b.Transport }

// Checkpoint saves the box's whole state into dir (which must not exist)
// and stops it.
func (x *BuildBox) Checkpoint(ctx context.Context, dir string) error {
	x.b.Transport.CloseIdleConnections()
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("checkpoint directory %s exists", dir)
	}
	defer x.m.adm.Busy()()
	return x.m.boxes.Checkpoint(ctx, x.b, dir, false)
}

// Destroy frees the box (once; later calls do nothing).
func (x *BuildBox) Destroy(ctx context.Context) {
	x.once.Do(func() { x.m.boxes.Destroy(ctx, x.b) })
}
