package manager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

func (m *Manager) pausedDir(id string) string { return filepath.Join(m.cfg.DataDir, "paused", id) }

// Pause freezes the sandbox at once (its processes stop, its memory stays)
// and, after SpillAfter, writes its whole state to disk and frees its
// memory and CPU. Pausing a paused sandbox is ErrAlreadyExists.
func (m *Manager) Pause(ctx context.Context, id string) error {
	l, err := m.locked(id)
	if err != nil {
		return err
	}
	defer l.mu.Unlock()
	if l.rec.State == sandbox.StatePaused {
		return errdefs.New(errdefs.ErrAlreadyExists, "sandbox %q is already paused", id)
	}
	if err := m.rt.Pause(ctx, l.box.rid); err != nil {
		return err
	}
	l.rec.State = sandbox.StatePaused
	if err := m.st.Put(ctx, l.rec); err != nil {
		_ = m.rt.Resume(context.WithoutCancel(ctx), l.box.rid)
		l.rec.State = sandbox.StateRunning
		return err
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	m.scheduleSpill(l)
	m.log.Info("sandbox paused", "sandbox.id", id)
	return nil
}

// scheduleSpill arms the move of a frozen sandbox to disk. Caller holds l.mu.
func (m *Manager) scheduleSpill(l *Live) {
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timer = time.AfterFunc(m.cfg.SpillAfter, func() {
		if err := m.Spill(context.Background(), l.rec.ID); err != nil {
			m.log.Error("spilling paused sandbox to disk", "sandbox.id", l.rec.ID, "err", err)
		}
	})
}

// Spill writes a frozen sandbox's state to disk and frees its memory. It
// does nothing to a running sandbox or one already on disk. The frozen box
// stays until the image is recorded (a checkpoint of a paused sandbox
// leaves it paused), so a crash at any point leaves one complete state.
func (m *Manager) Spill(ctx context.Context, id string) error {
	l, err := m.locked(id)
	if err != nil {
		return err
	}
	defer l.mu.Unlock()
	if l.rec.State != sandbox.StatePaused || l.box == nil {
		return nil
	}
	t0 := time.Now()
	img := m.pausedDir(id)
	if err := m.checkpointInto(ctx, l.box.rid, img, true); err != nil {
		return err
	}
	old := l.box
	l.rec.PausedImage, l.box = img, nil
	if err := m.st.Put(ctx, l.rec); err != nil {
		return err
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	timing.Since(ctx, "spill", t0)
	m.destroyLater(old, 0)
	m.log.Info("paused sandbox moved to disk", "sandbox.id", id, "bytes", imageSize(img))
	return nil
}

// Resume runs a paused sandbox again, from memory or from disk, and gives
// it timeout more to live (the default if 0). It reports false if the
// sandbox was running already.
func (m *Manager) Resume(ctx context.Context, id string, timeout time.Duration) (bool, error) {
	if timeout == 0 {
		timeout = m.cfg.DefaultTimeout
	}
	if err := m.checkTimeout(timeout); err != nil {
		return false, err
	}
	l, err := m.locked(id)
	if err != nil {
		return false, err
	}
	defer l.mu.Unlock()
	if l.rec.State == sandbox.StateRunning {
		return false, nil
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	if l.box != nil {
		if err := m.rt.Resume(ctx, l.box.rid); err != nil {
			return false, err
		}
	} else {
		release, err := m.adm.acquire(ctx)
		if err != nil {
			return false, err
		}
		limits := m.limits(l.rec)
		b, err := m.restoreBox(ctx, l.rec.PausedImage, l.rec.Rootfs, limits)
		release()
		if err == nil {
			if err = errors.Join(m.applyPolicy(b, l.rec.Network), m.postInit(ctx, b.transport, sandboxEnvs(l.rec, nil), &limits)); err != nil {
				m.destroyBox(context.WithoutCancel(ctx), b)
			}
		}
		if err != nil {
			m.scheduleSpill(l)
			return false, err
		}
		l.box, l.rec.RuntimeID = b, b.rid
		m.watchBox(ctx, l, b)
	}
	img := l.rec.PausedImage
	l.rec.State, l.rec.PausedImage = sandbox.StateRunning, ""
	l.rec.EndAt = time.Now().UTC().Add(timeout)
	if err := m.st.Put(ctx, l.rec); err != nil {
		return false, err
	}
	if img != "" {
		os.RemoveAll(img)
	}
	m.armTimer(l, id)
	m.log.Info("sandbox resumed", "sandbox.id", id, "from", map[bool]string{true: "disk", false: "memory"}[img != ""])
	return true, nil
}
