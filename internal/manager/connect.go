package manager

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Connecting: resuming a paused sandbox (from memory, from disk, or by a
// reboot from its files), and a running sandbox's timeout.

// SetTimeout makes the sandbox expire d from now (0: now).
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	if err := m.checkTimeout(d, true); err != nil {
		return err
	}
	l, err := m.begin(ctx, id, "changing its timeout", running, frozen, spilled)
	if err != nil {
		return err
	}
	defer l.op.Unlock()
	return m.setEnd(ctx, l, time.Now().UTC().Add(d))
}

// ExtendTimeout makes the sandbox expire no earlier than d from now (connect
// and refresh never shorten a sandbox's life).
func (m *Manager) ExtendTimeout(ctx context.Context, id string, d time.Duration) error {
	if err := m.checkTimeout(d, false); err != nil {
		return err
	}
	l, err := m.begin(ctx, id, "extending its timeout", running, frozen, spilled)
	if err != nil {
		return err
	}
	defer l.op.Unlock()
	return m.extend(ctx, l, d)
}

// extend is ExtendTimeout's transition. Caller holds l.op.
func (m *Manager) extend(ctx context.Context, l *Live, d time.Duration) error {
	end := time.Now().UTC().Add(d)
	if end.Before(l.rec.EndAt) {
		return nil
	}
	return m.setEnd(ctx, l, end)
}

// setEnd stores a new expiry and re-arms the timer. Caller holds l.op.
func (m *Manager) setEnd(ctx context.Context, l *Live, end time.Time) error {
	old := l.rec.EndAt
	l.update(func() { l.rec.EndAt = end })
	if err := m.put(ctx, l.rec); err != nil {
		l.update(func() { l.rec.EndAt = old })
		return err
	}
	if l.phase == running {
		m.armTimer(l)
	}
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
	l, err := m.begin(ctx, id, "connecting to it", running, frozen, spilled)
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
	l.leaveDisk()
	resume := m.resume
	if req.Reboot || l.rec.PauseMode == sandbox.PauseFiles {
		resume = m.reboot
	}
	undo := func() {}
	if l.phase == spilled && l.rec.PausedImage == "" {
		if undo, err = m.fetchPaused(ctx, l); err != nil {
			return nil, false, err
		}
	}
	if err := resume(ctx, l, timeout); err != nil {
		undo()
		return nil, false, err
	}
	return l.record(), true, nil
}

// fetchPaused imports a spilled sandbox's image, which is in the chunk
// store only, to the disk for a resume (which removes it once it runs);
// undo removes it again. Caller holds l.op.
func (m *Manager) fetchPaused(ctx context.Context, l *Live) (undo func(), err error) {
	if m.images == nil || l.rec.PausedRoot == "" {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q: its paused image is neither on this host's disk nor in a chunk store", l.rec.ID)
	}
	dir, _, err := m.importPaused(ctx, l.rec.ID, l.rec.PausedRoot)
	if err != nil {
		return nil, err
	}
	l.update(func() { l.rec.PausedImage = dir })
	return func() {
		l.update(func() { l.rec.PausedImage = "" })
		os.RemoveAll(dir)
	}, nil
}

// resume runs a paused sandbox again, for timeout more. On failure it is
// paused as it was. Caller holds l.op.
func (m *Manager) resume(ctx context.Context, l *Live, timeout time.Duration) error {
	// Foreground until the hand-off is done (see Create).
	defer m.adm.Busy()()
	was, img := l.phase, l.rec.PausedImage
	var cu cleanup.Cleanup
	defer cu.Clean()
	if was == frozen {
		if err := m.boxes.Resume(ctx, l.box); err != nil {
			return err
		}
		cu.Add(func() { _ = m.boxes.Pause(context.WithoutCancel(ctx), l.box) })
		// Network rules given while it was frozen.
		if err := m.boxes.Trust(ctx, l.box, l.rec.Network); err != nil {
			return err
		}
	} else {
		release, err := m.adm.Acquire(ctx)
		if err != nil {
			return err
		}
		limits := m.limits(l.rec)
		b, err := m.pool.Restore(ctx, img, l.rec.Rootfs, limits, limits)
		release()
		if err != nil {
			return err
		}
		cu.Add(func() { m.boxes.Destroy(context.WithoutCancel(ctx), b) })
		if err := m.boxes.HandOff(ctx, b, m.handOff(l.rec)); err != nil {
			return err
		}
		rid := l.rec.RuntimeID
		l.update(func() { l.box, l.rec.RuntimeID = b, b.RID })
		cu.Add(func() { l.update(func() { l.box, l.rec.RuntimeID = nil, rid }) })
	}
	prevEnd, mode, root := l.rec.EndAt, l.rec.PauseMode, l.rec.PausedRoot
	l.update(func() {
		l.rec.PausedImage, l.rec.PausedRoot, l.rec.PauseMode, l.rec.EndAt = "", "", "", time.Now().UTC().Add(timeout)
	})
	l.setPhase(running)
	cu.Add(func() {
		l.update(func() { l.rec.PausedImage, l.rec.PausedRoot, l.rec.PauseMode, l.rec.EndAt = img, root, mode, prevEnd })
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

// reboot runs a paused sandbox again by booting a new box from its files
// (the pause's own, or those taken out of its memory pause, which is then
// dropped), for timeout more. On failure it is paused as it was. Caller
// holds l.op.
func (m *Manager) reboot(ctx context.Context, l *Live, timeout time.Duration) error {
	defer m.adm.Busy()()
	was, img, mode := l.phase, l.rec.PausedImage, l.rec.PauseMode
	var cu cleanup.Cleanup
	defer cu.Clean()
	limits := m.limits(l.rec)
	upper, extra := "", ""
	if mode == sandbox.PauseFiles {
		upper = filepath.Join(img, upperTar)
	} else {
		// The files are in the memory pause: take them out.
		extra = m.pausedDir(l.rec.ID) + ".files-" + sandbox.RandomHex(4)
		if err := os.MkdirAll(extra, 0o700); err != nil {
			return err
		}
		cu.Add(func() { os.RemoveAll(extra) })
		upper = filepath.Join(extra, upperTar)
		src := l.box
		if was == spilled {
			release, err := m.adm.Acquire(ctx)
			if err != nil {
				return err
			}
			src, err = m.pool.Restore(ctx, img, l.rec.Rootfs, limits, limits)
			release()
			if err != nil {
				return err
			}
			defer m.boxes.DestroyLater(src, 0)
		}
		if err := m.boxes.ExportFiles(ctx, src, upper); err != nil {
			return err
		}
	}
	release, err := m.adm.Acquire(ctx)
	if err != nil {
		return err
	}
	b, err := m.boxes.Boot(ctx, l.rec.Rootfs, limits, upper)
	release()
	if err != nil {
		return err
	}
	cu.Add(func() { m.boxes.Destroy(context.WithoutCancel(ctx), b) })
	if err := m.boxes.HandOff(ctx, b, m.handOff(l.rec)); err != nil {
		return err
	}
	old, rid, prevEnd, root := l.box, l.rec.RuntimeID, l.rec.EndAt, l.rec.PausedRoot
	l.update(func() {
		l.box, l.rec.RuntimeID = b, b.RID
		l.rec.PausedImage, l.rec.PausedRoot, l.rec.PauseMode, l.rec.EndAt = "", "", "", time.Now().UTC().Add(timeout)
	})
	l.setPhase(running)
	cu.Add(func() {
		l.update(func() {
			l.box, l.rec.RuntimeID = old, rid
			l.rec.PausedImage, l.rec.PausedRoot, l.rec.PauseMode, l.rec.EndAt = img, root, mode, prevEnd
		})
		l.setPhase(was)
	})
	if err := m.put(ctx, l.rec); err != nil {
		return err
	}
	cu.Release()
	m.watchBox(l, b)
	m.armTimer(l)
	if old != nil {
		m.boxes.DestroyLater(old, 0) // the memory pause is dropped
	}
	os.RemoveAll(img)
	if extra != "" {
		os.RemoveAll(extra)
	}
	m.log.Info("sandbox resumed by a reboot from its files", "sandbox.id", l.rec.ID)
	return nil
}

// Endpoint is how the data plane reaches a running sandbox. A paused one is
// ErrFailedPrecondition (with its record, for the caller's access checks),
// unless it was created with autoResume and wake says the request may wake
// it: then it is resumed first, for the default lifetime.
func (m *Manager) Endpoint(ctx context.Context, id string, wake func(*sandbox.Sandbox) bool) (sandbox.Endpoint, error) {
	l, err := m.lookup(ctx, id)
	if err != nil {
		return sandbox.Endpoint{}, err
	}
	ep, p := l.endpoint()
	switch {
	case p == running:
		return ep, nil
	case p == dead:
		return sandbox.Endpoint{}, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	case ep.Sandbox.PauseMode == sandbox.PauseFiles:
		// As E2B: traffic never reboots a sandbox.
		return ep, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is paused with its files only: connect to resume it (it boots afresh)", id)
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

// userMessage is err's caller-facing message, or a generic one.
func userMessage(err error) string {
	if msg := errdefs.UserMessage(err); msg != "" {
		return msg
	}
	return "internal error"
}
