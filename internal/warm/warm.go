// Package warm makes the built-in templates' warm images. A warm image is
// a template's checkpoint taken right after boot: agent up, default code
// context started, pre-imports done. Creating a sandbox restores it
// instead of booting. The hosts of a cluster share one per template and
// boot configuration through the chunk store; a host that builds one
// gives it a first request before anything else restores it (warmup.go).
// It depends on the box factory and the start admission, not on the
// manager.
package warm

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/pool"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
)

// Templates gives the built-in templates' root filesystems and warm-image
// keys (internal/template).
type Templates interface {
	Rootfs(ctx context.Context, name string, progress io.Writer) (string, error)
	WarmKey(name, runtime, boot string) (string, error)
}

// Images is the chunk store, as far as warm images travel through it.
type Images interface {
	Export(ctx context.Context, dir string, meta map[string]string) (root string, uploaded int64, err error)
	Import(ctx context.Context, root, dir string) (fetched int64, err error)
}

// Cluster records the warm image each template's key has in a cluster.
type Cluster interface {
	// WarmImage returns the root of the warm image published for a
	// built-in template's warm key ("" if none yet); PublishWarm records
	// root for it unless another host did first, and returns the root on
	// record.
	WarmImage(ctx context.Context, name, key string) (string, error)
	PublishWarm(ctx context.Context, name, key, root string) (string, error)
}

// Deps are what warm images are made with. Images and Cluster are nil on
// a single host.
type Deps struct {
	Templates Templates
	Boxes     *box.Factory
	Admission *pool.Admission
	Images    Images
	Cluster   Cluster
	Log       *slog.Logger
}

// Maker makes warm images. Safe for concurrent use.
type Maker struct {
	runtime string
	d       Deps
}

// New returns a Maker for images that runtime (Config.RuntimeBuild of the
// manager: what restores only images it wrote) restores.
func New(runtime string, d Deps) *Maker { return &Maker{runtime: runtime, d: d} }

// Warm makes sure the template has a warm image of its limits (building
// it if needed: creates boot until it has one) and returns it for the
// pool. The image is held (template.InUse) until the daemon exits.
func (m *Maker) Warm(ctx context.Context, name string, limits sandbox.Limits) (pool.Warm, error) {
	rootfs, err := m.d.Templates.Rootfs(ctx, name, io.Discard)
	if err != nil {
		return pool.Warm{}, err
	}
	key, err := m.d.Templates.WarmKey(name, m.runtime, m.d.Boxes.BootKey(limits.DiskMB))
	if err != nil {
		return pool.Warm{}, err
	}
	dir := filepath.Dir(rootfs)
	image := filepath.Join(dir, "warm-"+key)
	// Daemons sharing a template directory build the image once.
	unlock, err := template.Lock(filepath.Join(dir, ".warm.lock"))
	if err != nil {
		return pool.Warm{}, err
	}
	defer unlock()
	switch {
	case box.Complete(image):
		m.publish(ctx, name, key, image, true)
	case m.pull(ctx, name, key, image):
	default:
		t0 := time.Now()
		m.d.Log.Info("building warm image", "template", name, "preimport", strings.Join(template.Preimport(name), ","))
		if err := m.build(ctx, name, rootfs, image, limits); err != nil {
			return pool.Warm{}, fmt.Errorf("building warm image of %s: %w", name, err)
		}
		m.recordWorkingSet(ctx, name, rootfs, image, limits) // before any refill restores it (warmup.go)
		m.d.Log.Info("warm image ready", "template", name, "ms", time.Since(t0).Milliseconds())
		m.publish(ctx, name, key, image, false)
	}
	// Held until the daemon exits: pool refills and creates restore it.
	if _, err := template.InUse(image); err != nil {
		return pool.Warm{}, err
	}
	prune(dir, filepath.Base(image))
	return pool.Warm{Rootfs: rootfs, Image: image, Limits: limits}, nil
}

// meta is what a built-in template's warm image is stored with: the same
// as the store notes it with (ImageStore.Remember), so that both name one
// root and the images written over it share one base on every host.
var meta = map[string]string{"kind": "warm-image"}

// pull imports the warm image another host of the cluster published for
// the template's warm key into image, and reports whether it did (if not,
// the caller builds its own). The caller holds the warm lock.
func (m *Maker) pull(ctx context.Context, name, key, image string) bool {
	if m.d.Cluster == nil || m.d.Images == nil {
		return false
	}
	root, err := m.d.Cluster.WarmImage(ctx, name, key)
	if err != nil || root == "" {
		if err != nil {
			m.d.Log.Warn("finding the cluster's warm image; building this host's own", "template", name, "err", err)
		}
		return false
	}
	t0 := time.Now()
	if err := m.importInto(ctx, root, image); err != nil {
		m.d.Log.Warn("pulling the cluster's warm image; building this host's own", "template", name, "root", root, "err", err)
		return false
	}
	m.d.Log.Info("warm image pulled from the cluster", "template", name, "root", root, "ms", time.Since(t0).Milliseconds())
	return true
}

// importInto imports root into image (replacing what is there), beside it
// first.
func (m *Maker) importInto(ctx context.Context, root, image string) error {
	tmp := image + ".tmp-pull"
	_ = os.RemoveAll(tmp)
	if _, err := m.d.Images.Import(ctx, root, tmp); err != nil {
		return err
	}
	_ = os.RemoveAll(image) // an incomplete one
	if err := os.Rename(tmp, image); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	return nil
}

// publish stores the warm image this host has and records it for the
// template's warm key; with unlessAny (an image this host had before it
// started, which it may have pulled), only when none is recorded. Another
// host that published first wins: this host then takes that one instead
// (a sandbox restored from its own keeps the file it mapped), so that
// every host restores the same image. Failures leave this host on its own
// image, which is as good for it.
func (m *Maker) publish(ctx context.Context, name, key, image string, unlessAny bool) {
	if m.d.Cluster == nil || m.d.Images == nil {
		return
	}
	if unlessAny {
		if root, err := m.d.Cluster.WarmImage(ctx, name, key); err != nil || root != "" {
			return
		}
	}
	root, _, err := m.d.Images.Export(ctx, image, meta)
	if err == nil {
		var got string
		if got, err = m.d.Cluster.PublishWarm(ctx, name, key, root); err == nil && got != root {
			err = m.importInto(ctx, got, image)
			root = got
		}
	}
	if err != nil {
		m.d.Log.Warn("publishing the warm image to the cluster", "template", name, "err", err)
		return
	}
	m.d.Log.Info("warm image published to the cluster", "template", name, "root", root)
}

// build boots the template with its limits (its disk is frozen in the
// image) and the maximum process limits, which each sandbox's hand-off
// lowers, and checkpoints it once its default code context is up.
func (m *Maker) build(ctx context.Context, name, rootfs, image string, limits sandbox.Limits) error {
	f := m.d.Boxes
	b, err := f.Boot(ctx, rootfs, limits, "", "CELLFORK_PREIMPORT="+strings.Join(template.Preimport(name), ","))
	if err != nil {
		return err
	}
	defer f.Destroy(context.WithoutCancel(ctx), b)
	// No identity, no limits, no egress: those come at each hand-off.
	if err := f.HandOff(ctx, b, box.HandOff{}); err != nil {
		return err
	}
	// Wait for the default code context (and its pre-imports).
	if err := f.Agent().WaitReady(ctx, b); err != nil {
		return err
	}
	b.Transport.CloseIdleConnections()
	defer m.d.Admission.Busy()()
	return f.Checkpoint(ctx, b, image, false)
}

// prune removes the template's other warm images that no running daemon
// uses (another build of the agent may be restoring its own), and
// half-built ones (only built under the lock this caller holds).
func prune(dir, keep string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		switch n := e.Name(); {
		case !e.IsDir() || !strings.HasPrefix(n, "warm-") || n == keep:
		case strings.Contains(n, ".tmp-"):
			_ = os.RemoveAll(filepath.Join(dir, n))
		default:
			template.Prune(filepath.Join(dir, n))
		}
	}
}
