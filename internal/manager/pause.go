package manager

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

func (m *Manager) pausedDir(id string) string { return filepath.Join(m.cfg.DataDir, "paused", id) }

// Pause freezes the sandbox at once (its processes stop, its memory stays)
// and, after SpillAfter (at once with req.Spill), writes its whole state to
// disk and frees its memory and CPU. Pausing a paused sandbox is
// ErrAlreadyExists, unless req.Spill: then a frozen one moves to disk now.
func (m *Manager) Pause(ctx context.Context, id string, req sandbox.PauseRequest) error {
	allowed := []phase{running}
	if req.Spill {
		allowed = append(allowed, frozen, spilled)
	}
	l, err := m.begin(id, "pausing it", allowed...)
	if err != nil {
		return err
	}
	defer l.op.Unlock()
	if l.phase == running {
		if err := m.freeze(ctx, l); err != nil {
			return err
		}
		m.log.Info("sandbox paused", "sandbox.id", id)
	}
	if req.Spill && l.phase == frozen {
		return m.spill(ctx, l)
	}
	if l.phase == frozen {
		m.scheduleSpill(l)
	}
	return nil
}

// freeze pauses l's box in memory. Caller holds l.op.
func (m *Manager) freeze(ctx context.Context, l *Live) error {
	if err := m.boxes.Pause(ctx, l.box); err != nil {
		return err
	}
	l.setPhase(frozen)
	if err := m.put(ctx, l.rec); err != nil {
		_ = m.boxes.Resume(context.WithoutCancel(ctx), l.box)
		l.setPhase(running)
		return err
	}
	l.update(func() {
		if l.timer != nil {
			l.timer.Stop()
		}
	})
	return nil
}

// scheduleSpill arms the move of a frozen sandbox to disk. Caller holds
// l.op.
func (m *Manager) scheduleSpill(l *Live) {
	id := l.rec.ID
	l.update(func() {
		if l.timer != nil {
			l.timer.Stop()
		}
		l.timer = time.AfterFunc(m.cfg.SpillAfter, func() {
			l, err := m.begin(id, "moving it to disk", frozen)
			if err != nil {
				return // resumed, spilled or killed meanwhile
			}
			defer l.op.Unlock()
			if err := m.spill(context.Background(), l); err != nil {
				m.log.Error("spilling paused sandbox to disk", "sandbox.id", id, "err", err)
			}
		})
	})
}

// spill writes a frozen sandbox's state to disk and frees its memory. The
// frozen box stays until the image is recorded (a checkpoint of a paused
// box leaves it paused), so a crash at any point leaves one complete
// state. Caller holds l.op.
func (m *Manager) spill(ctx context.Context, l *Live) error {
	t0 := time.Now()
	img := m.pausedDir(l.rec.ID)
	if err := m.checkpoint(ctx, l, img); err != nil {
		return err
	}
	old := l.box
	l.update(func() {
		l.phase, l.box, l.rec.PausedImage = spilled, nil, img
		if l.timer != nil {
			l.timer.Stop()
		}
	})
	if err := m.put(ctx, l.rec); err != nil {
		l.update(func() { l.phase, l.box, l.rec.PausedImage = frozen, old, "" })
		os.RemoveAll(img)
		return err
	}
	timing.Since(ctx, "spill", t0)
	m.boxes.DestroyLater(old, 0)
	m.log.Info("paused sandbox moved to disk", "sandbox.id", l.rec.ID, "bytes", imageSize(img))
	return nil
}

// Connect returns the sandbox, resuming it if it is paused (from memory or
// from disk). A running sandbox's life is only extended (to req.Timeout
// from now, if longer); a resumed one gets req.Timeout (the default if 0).
// It reports whether it resumed.
func (m *Manager) Connect(ctx context.Context, id string, req sandbox.ConnectRequest) (*sandbox.Sandbox, bool, error) {
	timeout := req.Timeout
	if err := m.checkTimeout(timeout, true); err != nil {
		return nil, false, err
	}
	l, err := m.begin(id, "connecting to it", running, frozen, spilled)
	if err != nil {
		return nil, false, err
	}
	defer l.op.Unlock()
	if l.phase == running {
		if req.MustBePaused {
			return nil, false, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is not paused", id)
		}
		if timeout != 0 {
			if err := m.extend(ctx, l, timeout); err != nil {
				return nil, false, err
			}
		}
		return l.record(), false, nil
	}
	if timeout == 0 {
		timeout = m.cfg.DefaultTimeout
	}
	if err := m.resume(ctx, l, timeout); err != nil {
		return nil, false, err
	}
	return l.record(), true, nil
}

// resume runs a paused sandbox again, for timeout more. On failure it is
// paused as it was. Caller holds l.op.
func (m *Manager) resume(ctx context.Context, l *Live, timeout time.Duration) error {
	was, img := l.phase, l.rec.PausedImage
	var cu cleanup.Cleanup
	defer cu.Clean()
	if was == frozen {
		if err := m.boxes.Resume(ctx, l.box); err != nil {
			return err
		}
		cu.Add(func() { _ = m.boxes.Pause(context.WithoutCancel(ctx), l.box) })
	} else {
		release, err := m.adm.Acquire(ctx)
		if err != nil {
			return err
		}
		limits := m.limits(l.rec)
		b, err := m.pool.Restore(ctx, img, l.rec.Rootfs, limits)
		release()
		if err != nil {
			return err
		}
		cu.Add(func() { m.boxes.Destroy(context.WithoutCancel(ctx), b) })
		if err := m.boxes.HandOff(ctx, b, m.handOff(l.rec)); err != nil {
			return err
		}
		l.update(func() { l.box, l.rec.RuntimeID = b, b.RID })
		cu.Add(func() { l.update(func() { l.box = nil }) })
	}
	prevEnd := l.rec.EndAt
	l.update(func() {
		l.rec.PausedImage, l.rec.EndAt = "", time.Now().UTC().Add(timeout)
	})
	l.setPhase(running)
	cu.Add(func() {
		l.update(func() { l.rec.PausedImage, l.rec.EndAt = img, prevEnd })
		l.setPhase(was)
	})
	if err := m.put(ctx, l.rec); err != nil {
		return err
	}
	cu.Release()
	if was == spilled {
		m.watchBox(l, l.box)
		os.RemoveAll(img)
	}
	m.armTimer(l)
	m.log.Info("sandbox resumed", "sandbox.id", l.rec.ID, "from", map[bool]string{true: "disk", false: "memory"}[was == spilled])
	return nil
}

// Endpoint is how the data plane reaches a running sandbox. A paused one is
// ErrFailedPrecondition (with its record, for the caller's access checks),
// unless it was created with autoResume and wake says the request may wake
// it: then it is resumed first, for the default lifetime.
func (m *Manager) Endpoint(ctx context.Context, id string, wake func(*sandbox.Sandbox) bool) (sandbox.Endpoint, error) {
	l, err := m.lookup(id)
	if err != nil {
		return sandbox.Endpoint{}, err
	}
	ep, p := l.endpoint()
	switch {
	case p == running:
		return ep, nil
	case p == dead:
		return sandbox.Endpoint{}, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	case !ep.Sandbox.AutoResume || wake == nil || !wake(ep.Sandbox):
		return ep, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is paused: connect to resume it", id)
	}
	// E2B's lifecycle.autoResume.
	if _, _, err := m.Connect(ctx, id, sandbox.ConnectRequest{}); err != nil {
		return ep, errdefs.New(errdefs.ErrUnavailable, "The paused sandbox could not be resumed: %s", userMessage(err))
	}
	if ep, p = l.endpoint(); p != running {
		return ep, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is %s", id, p)
	}
	return ep, nil
}

// endpoint returns l's endpoint (Transport and Alive only while it runs)
// and phase.
func (l *Live) endpoint() (sandbox.Endpoint, phase) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ep := sandbox.Endpoint{Sandbox: cloneRecord(l.rec)}
	if l.phase == running {
		ep.Transport, ep.Alive = l.box.Transport, l.box.Alive()
	}
	return ep, l.phase
}

// userMessage is err's caller-facing message, or a generic one.
func userMessage(err error) string {
	if msg := errdefs.UserMessage(err); msg != "" {
		return msg
	}
	return "internal error"
}
