package manager

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/template"
)

// warmImage is a template's checkpoint taken right after boot: agent up,
// default code context started, pre-imports done. Creating a sandbox
// restores it instead of booting.
type warmImage struct {
	rootfs string
	image  string
}

// Warm makes sure the template has a warm image (building it if needed)
// and hands it to the pool. Without one, creates boot the template.
func (m *Manager) Warm(ctx context.Context, name string) error {
	rootfs, err := m.tpl.Rootfs(ctx, name, io.Discard)
	if err != nil {
		return err
	}
	key, err := m.tpl.WarmKey(name, m.cfg.RuntimeBuild, m.bootKey(name))
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
	if _, err := os.Stat(filepath.Join(image, "checkpoint.img")); err != nil {
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
	m.pool.setWarm(name, warmImage{rootfs: rootfs, image: image})
	return nil
}

func (m *Manager) buildWarm(ctx context.Context, name, rootfs, image string) error {
	// The template's size (its disk is frozen in the image) and the
	// maximum process limits, which each sandbox's hand-off lowers.
	b, err := m.bootBox(ctx, rootfs, m.templateLimits(name),
		"CELLFORK_PREIMPORT="+strings.Join(template.Preimport(name), ","))
	if err != nil {
		return err
	}
	defer m.destroyBox(context.WithoutCancel(ctx), b)
	if err := m.postInit(ctx, b.transport, nil, nil); err != nil {
		return err
	}
	// Wait for the default code context (and its pre-imports).
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodGet, fmt.Sprintf("http://sandbox:%d/ready", CodeInterpreterPort), nil)
	resp, err := b.transport.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("waiting for the default code context: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("default code context failed to start: %s", resp.Status)
	}
	b.transport.CloseIdleConnections()
	return m.checkpointInto(ctx, b.rid, image, false)
}

// checkpointInto writes a checkpoint to a temporary directory and renames
// it into place, so that a crash never leaves a half-written image at path.
func (m *Manager) checkpointInto(ctx context.Context, rid, path string, leaveRunning bool) error {
	defer m.adm.busy()()
	tmp := path + ".tmp-" + randomHex(4)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	if err := m.rt.Checkpoint(ctx, rid, tmp, leaveRunning); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
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

// imageSize is the bytes an image directory holds of its own. Its
// base-*.img are the images it references instead of holding their pages
// (internal/runtime/gvisor/bases.go): hard links to files other images
// hold, which cost no disk and are not counted, or copies (of an image that
// was in memory or on another filesystem), which are.
func imageSize(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && strings.HasPrefix(e.Name(), "base-") && st.Nlink > 1 {
			continue
		}
		n += fi.Size()
	}
	return n
}
