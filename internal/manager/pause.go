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
// disk and frees its memory and CPU. With req.FilesOnly it saves only its
// files, to disk, and frees everything else at once: resuming boots it
// afresh. Pausing a paused sandbox is ErrAlreadyExists, unless req.Spill:
// then a frozen one moves to disk now.
func (m *Manager) Pause(ctx context.Context, id string, req sandbox.PauseRequest) error {
	allowed := []phase{running}
	if req.Spill && !req.FilesOnly {
		allowed = append(allowed, frozen, spilled)
	}
	l, err := m.begin(ctx, id, "pausing it", allowed...)
	if err != nil {
		return err
	}
	defer l.op.Unlock()
	if l.phase == running {
		if req.FilesOnly || req.RequireHealthyAgent {
			// A filesystem-only pause reboots the sandbox on resume: an
			// agent that does not answer now would come back as it is.
			if err := m.boxes.Agent().Health(ctx, l.box); err != nil {
				return errdefs.New(errdefs.ErrUnavailable, "sandbox %q: its agent does not answer, so it was not paused; retry later", id)
			}
		}
		if req.FilesOnly {
			return m.pauseFiles(ctx, l)
		}
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
	l.update(func() { l.rec.PauseMode = sandbox.PauseFull })
	if err := m.put(ctx, l.rec); err != nil {
		_ = m.boxes.Resume(context.WithoutCancel(ctx), l.box)
		l.setPhase(running)
		l.update(func() { l.rec.PauseMode = "" })
		return err
	}
	l.update(func() {
		if l.timer != nil {
			l.timer.Stop()
		}
	})
	return nil
}

// upperTar is the file of a paused image that holds a sandbox's files.
const upperTar = "rootfs-upper.tar"

// pauseFiles saves a running sandbox's files (not its memory) to disk and
// destroys its box. Caller holds l.op.
func (m *Manager) pauseFiles(ctx context.Context, l *Live) error {
	defer m.adm.Busy()()
	b := l.box
	if err := m.boxes.Pause(ctx, b); err != nil { // a consistent set of files
		return err
	}
	cu := cleanup.Make(func() { _ = m.boxes.Resume(context.WithoutCancel(ctx), b) })
	defer cu.Clean()
	dir := m.pausedDir(l.rec.ID)
	tmp := dir + ".tmp-" + sandbox.RandomHex(4)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	cu.Add(func() { os.RemoveAll(tmp) })
	if err := m.boxes.ExportFiles(ctx, b, filepath.Join(tmp, upperTar)); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	cu.Add(func() { os.RemoveAll(dir) })
	l.update(func() {
		l.box, l.rec.PausedImage, l.rec.PauseMode = nil, dir, sandbox.PauseFiles
		if l.timer != nil {
			l.timer.Stop()
		}
	})
	l.setPhase(spilled)
	cu.Add(func() {
		l.update(func() { l.box, l.rec.PausedImage, l.rec.PauseMode = b, "", "" })
		l.setPhase(running)
	})
	if err := m.put(ctx, l.rec); err != nil {
		return err
	}
	cu.Release()
	m.boxes.DestroyLater(b, 0)
	m.queuePausedUpload(l.rec.ID)
	m.log.Info("sandbox paused, its files only", "sandbox.id", l.rec.ID)
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
			l, err := m.begin(context.Background(), id, "moving it to disk", frozen)
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
	m.queuePausedUpload(l.rec.ID)
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
	resume := m.resume
	if req.Reboot || l.rec.PauseMode == sandbox.PauseFiles {
		resume = m.reboot
	}
	if err := resume(ctx, l, timeout); err != nil {
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
			src, err = m.pool.Restore(ctx, img, l.rec.Rootfs, limits)
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
	old, prevEnd, root := l.box, l.rec.EndAt, l.rec.PausedRoot
	l.update(func() {
		l.box, l.rec.RuntimeID = b, b.RID
		l.rec.PausedImage, l.rec.PausedRoot, l.rec.PauseMode, l.rec.EndAt = "", "", "", time.Now().UTC().Add(timeout)
	})
	l.setPhase(running)
	cu.Add(func() {
		l.update(func() {
			l.box, l.rec.PausedImage, l.rec.PausedRoot, l.rec.PauseMode, l.rec.EndAt = old, img, root, mode, prevEnd
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
