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
	if !complete(image) {
		t0 := time.Now()
		m.log.Info("building warm image", "template", name, "preimport", strings.Join(template.Preimport(name), ","))
		if err := m.buildWarm(ctx, name, rootfs, image); err != nil {
			return fmt.Errorf("building warm image of %s: %w", name, err)
		}
		m.log.Info("warm image ready", "template", name, "ms", time.Since(t0).Milliseconds())
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
