package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// A daemon's start and stop: Reconcile with what runs, Start, Close.

// Start starts the pool's refills, the samples and the uploads, and warms
// the built-in template (internal/warm).
func (m *Manager) Start(ctx context.Context) error {
	m.pool.Start()
	m.loops.Go(func() { m.samples.Run(m.closing, m.running) })
	m.requeuePausedUploads(ctx)
	m.snaps.Start(ctx)
	w, err := m.warm.Warm(ctx, "base", m.templateLimits("base"))
	if err != nil {
		// Creates still work: they boot instead of restoring.
		m.log.Error("no warm image; creates will boot", "template", "base", "err", err)
		return nil
	}
	m.pool.SetWarm("base", w)
	m.snaps.Remember(w.Image)
	return nil
}

// Close stops the timers and the pool (destroying pooled boxes). Sandboxes
// keep running; the next daemon adopts them.
func (m *Manager) Close() {
	close(m.closing)
	m.snaps.Close()
	m.loops.Wait()
	m.pool.Close()
	m.boxes.Close()
	for _, l := range m.lives() {
		l.mu.Lock()
		if l.timer != nil {
			l.timer.Stop()
		}
		if l.box != nil {
			m.boxes.Release(l.box)
		}
		l.mu.Unlock()
	}
}

// Reconcile makes the daemon's view match reality after a start: it adopts
// sandboxes that are recorded and still there (running, frozen, or paused
// on disk), and removes whatever it cannot account for: records without a
// sandbox, runtimes, networks, bundles, half-written images and images
// without a record.
func (m *Manager) Reconcile(ctx context.Context) error {
	recs, err := m.st.List(ctx)
	if err != nil {
		return err
	}
	keep := map[string]bool{} // runtime ids and image paths in use
	for _, rec := range recs {
		if m.adoptRecord(ctx, rec) {
			keep[rec.PausedImage] = true
			if rec.PausedImage == "" {
				keep[rec.RuntimeID] = true
			}
			continue
		}
		m.log.Warn("removing sandbox that did not survive", "sandbox.id", rec.ID)
		_ = m.st.Delete(ctx, rec.ID)
		if rec.PausedImage != "" {
			_ = os.RemoveAll(rec.PausedImage)
		}
	}
	errs := []error{m.boxes.Sweep(ctx, func(rid string) bool { return keep[rid] })}
	removeUnknown(filepath.Join(m.cfg.DataDir, "paused"), func(p string) bool { return keep[p] })
	removeUnknown(filepath.Join(m.cfg.DataDir, "forks"), func(string) bool { return false })
	removeUnknown(m.forkDir(), func(string) bool { return false })
	errs = append(errs, m.snaps.Reconcile(ctx))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reconciling: %w", err)
	}
	return nil
}

// removeUnknown deletes the entries of dir that keep does not claim.
func removeUnknown(dir string, keep func(path string) bool) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if p := filepath.Join(dir, e.Name()); !keep(p) {
			_ = os.RemoveAll(p)
		}
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// adoptRecord takes over a recorded sandbox that is still there, trusting
// what it finds over the record where a crash fell between the two: a
// sandbox frozen but recorded as running is paused; a paused sandbox whose
// image was written but not yet recorded is paused on disk.
func (m *Manager) adoptRecord(ctx context.Context, rec *sandbox.Sandbox) bool {
	if rec.State == sandbox.StatePaused {
		img := cmp.Or(rec.PausedImage, m.pausedDir(rec.ID))
		if box.Complete(img) || rec.PauseMode == sandbox.PauseFiles && fileExists(filepath.Join(img, upperTar)) {
			if rec.PausedImage == "" {
				rec.PausedImage = img
				_ = m.st.Put(ctx, rec)
			}
			_ = m.boxes.DestroyRID(ctx, rec.RuntimeID) // a frozen copy may remain
			m.register(newLive(rec, nil))
			m.log.Info("adopted sandbox paused on disk", "sandbox.id", rec.ID)
			return true
		}
		if rec.PausedImage == "" && rec.PausedRoot != "" { // without a store, a resume says why it cannot
			_ = m.boxes.DestroyRID(ctx, rec.RuntimeID)
			m.register(newLive(rec, nil))
			m.log.Info("adopted sandbox paused in the chunk store", "sandbox.id", rec.ID)
			return true
		}
	}
	rec.PausedImage = ""
	state, err := m.boxes.Runtime().State(ctx, rec.RuntimeID)
	if err == nil && state == sandbox.RuntimeUnsure {
		return m.adoptToDisk(ctx, rec)
	}
	if err != nil || (state != "running" && state != "paused") {
		return false
	}
	if want := sandbox.State(state); rec.State != want {
		m.log.Warn("sandbox state differs from its record; keeping what runs", "sandbox.id", rec.ID, "record", rec.State, "runtime", state)
		rec.State = want
		_ = m.st.Put(ctx, rec)
	}
	b, err := m.boxes.Adopt(rec.RuntimeID, rec.Rootfs, m.limits(rec))
	if err != nil {
		return false
	}
	// The router kept its rules; stating the policy again tells the
	// network's resolver and proxy.
	if err := m.boxes.SetPolicy(b, rec.Network); err != nil {
		m.boxes.Release(b)
		return false
	}
	if rec.State == sandbox.StateRunning {
		// The agent must still answer, or the sandbox is of no use.
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		c, err := b.Net.Dial(cctx, envd.Port)
		if err != nil {
			m.boxes.Release(b)
			return false
		}
		c.Close()
	}
	m.register(newLive(rec, b))
	m.log.Info("adopted sandbox", "sandbox.id", rec.ID, "state", rec.State)
	return true
}

// adoptToDisk takes over a sandbox a crash caught mid pause or resume. It
// may be frozen, but whether a resume would thaw it is unknown; a
// checkpoint is exact either way. So its state moves to disk and it stays
// paused there (the interrupted call failed as far as its caller knows).
func (m *Manager) adoptToDisk(ctx context.Context, rec *sandbox.Sandbox) bool {
	img := m.pausedDir(rec.ID)
	_ = os.RemoveAll(img)
	if err := m.boxes.CheckpointRID(ctx, rec.RuntimeID, img, true); err != nil {
		m.log.Warn("saving a sandbox caught mid pause", "sandbox.id", rec.ID, "err", err)
		return false
	}
	rec.State, rec.PausedImage = sandbox.StatePaused, img
	if err := m.st.Put(ctx, rec); err != nil {
		_ = os.RemoveAll(img)
		return false
	}
	_ = m.boxes.DestroyRID(ctx, rec.RuntimeID)
	m.register(newLive(rec, nil))
	m.log.Info("adopted sandbox caught mid pause, paused on disk", "sandbox.id", rec.ID)
	return true
}
