package manager

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/pool"
	"github.com/cellfork/cellfork/internal/template"
)

// Warm makes sure the template has a warm image (building it if needed)
// and hands it to the pool. A warm image is a template's checkpoint taken
// right after boot: agent up, default code context started, pre-imports
// done. Creating a sandbox restores it instead of booting; without one,
// creates boot the template.
func (m *Manager) Warm(ctx context.Context, name string) error {
	rootfs, err := m.tpl.Rootfs(ctx, name, io.Discard)
	if err != nil {
		return err
	}
	limits := m.templateLimits(name)
	key, err := m.tpl.WarmKey(name, m.cfg.RuntimeBuild, m.boxes.BootKey(limits.DiskMB))
	if err != nil {
		return err
	}
	dir := filepath.Dir(rootfs)
	image := filepath.Join(dir, "warm-"+key)
	// Daemons sharing a template directory build the image once.
	unlock, err := template.Lock(filepath.Join(dir, ".warm.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	switch {
	case complete(image):
		m.publishWarm(ctx, name, key, image, true)
	case m.pullWarm(ctx, name, key, image):
	default:
		t0 := time.Now()
		m.log.Info("building warm image", "template", name, "preimport", strings.Join(template.Preimport(name), ","))
		if err := m.buildWarm(ctx, name, rootfs, image); err != nil {
			return fmt.Errorf("building warm image of %s: %w", name, err)
		}
		m.recordWorkingSet(ctx, name, rootfs, image) // before any refill restores it (warmup.go)
		m.log.Info("warm image ready", "template", name, "ms", time.Since(t0).Milliseconds())
		m.publishWarm(ctx, name, key, image, false)
	}
	// Held until the daemon exits: pool refills and creates restore it.
	if _, err := template.InUse(image); err != nil {
		return err
	}
	pruneWarm(dir, filepath.Base(image))
	m.pool.SetWarm(name, pool.Warm{Rootfs: rootfs, Image: image, Limits: limits})
	m.remember(image)
	return nil
}

// warmMeta is what a built-in template's warm image is stored with: the
// same as the store notes it with (ImageStore.Remember), so that both name
// one root and the images written over it share one base on every host.
var warmMeta = map[string]string{"kind": "warm-image"}

// pullWarm imports the warm image another host of the cluster published
// for the template's warm key into image, and reports whether it did (if
// not, the caller builds its own). The caller holds the warm lock.
func (m *Manager) pullWarm(ctx context.Context, name, key, image string) bool {
	if m.cluster == nil || m.images == nil {
		return false
	}
	root, err := m.cluster.WarmImage(ctx, name, key)
	if err != nil || root == "" {
		if err != nil {
			m.log.Warn("finding the cluster's warm image; building this host's own", "template", name, "err", err)
		}
		return false
	}
	t0 := time.Now()
	if err := m.importWarm(ctx, root, image); err != nil {
		m.log.Warn("pulling the cluster's warm image; building this host's own", "template", name, "root", root, "err", err)
		return false
	}
	m.log.Info("warm image pulled from the cluster", "template", name, "root", root, "ms", time.Since(t0).Milliseconds())
	return true
}

// importWarm imports root into image (replacing what is there), beside it
// first.
func (m *Manager) importWarm(ctx context.Context, root, image string) error {
	tmp := image + ".tmp-pull"
	_ = os.RemoveAll(tmp)
	if _, err := m.images.Import(ctx, root, tmp); err != nil {
		return err
	}
	_ = os.RemoveAll(image) // an incomplete one
	if err := os.Rename(tmp, image); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	return nil
}

// publishWarm stores the warm image this host has and records it for the
// template's warm key; with unlessAny (an image this host had before it
// started, which it may have pulled), only when none is recorded. Another
// host that published first wins: this host then takes that one instead
// (a sandbox restored from its own keeps the file it mapped), so that
// every host restores the same image. Failures leave this host on its own
// image, which is as good for it.
func (m *Manager) publishWarm(ctx context.Context, name, key, image string, unlessAny bool) {
	if m.cluster == nil || m.images == nil {
		return
	}
	if unlessAny {
		if root, err := m.cluster.WarmImage(ctx, name, key); err != nil || root != "" {
			return
		}
	}
	root, _, err := m.images.Export(ctx, image, warmMeta)
	if err == nil {
		var got string
		if got, err = m.cluster.PublishWarm(ctx, name, key, root); err == nil && got != root {
			err = m.importWarm(ctx, got, image)
			root = got
		}
	}
	if err != nil {
		m.log.Warn("publishing the warm image to the cluster", "template", name, "err", err)
		return
	}
	m.log.Info("warm image published to the cluster", "template", name, "root", root)
}

func (m *Manager) buildWarm(ctx context.Context, name, rootfs, image string) error {
	// The template's size (its disk is frozen in the image) and the
	// maximum process limits, which each sandbox's hand-off lowers.
	b, err := m.boxes.Boot(ctx, rootfs, m.templateLimits(name), "",
		"CELLFORK_PREIMPORT="+strings.Join(template.Preimport(name), ","))
	if err != nil {
		return err
	}
	defer m.boxes.Destroy(context.WithoutCancel(ctx), b)
	// No identity, no limits, no egress: those come at each hand-off.
	if err := m.boxes.HandOff(ctx, b, box.HandOff{}); err != nil {
		return err
	}
	// Wait for the default code context (and its pre-imports).
	if err := m.boxes.Agent().WaitReady(ctx, b); err != nil {
		return err
	}
	b.Transport.CloseIdleConnections()
	defer m.adm.Busy()()
	return m.boxes.Checkpoint(ctx, b, image, false)
}

// pruneWarm removes the template's other warm images that no running
// daemon uses (another build of the agent may be restoring its own), and
// half-built ones (only built under the lock this caller holds).
func pruneWarm(dir, keep string) {
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
