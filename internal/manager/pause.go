package manager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// Pausing, and a sandbox's timers, which pause (or kill) it: a running
// sandbox expires at its end (register, armTimer), a frozen one moves to
// disk after SpillAfter (scheduleSpill).

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

// freeze pauses l's box in memory. On failure l runs as it did. Caller
// holds l.op.
func (m *Manager) freeze(ctx context.Context, l *Live) error {
	if err := m.boxes.Pause(ctx, l.box); err != nil {
		return err
	}
	cu := cleanup.Make(func() { _ = m.boxes.Resume(context.WithoutCancel(ctx), l.box) })
	defer cu.Clean()
	l.setPhase(frozen)
	l.update(func() { l.rec.PauseMode = sandbox.PauseFull })
	cu.Add(func() {
		l.setPhase(running)
		l.update(func() { l.rec.PauseMode = "" })
	})
	if err := m.put(ctx, l.rec); err != nil {
		return err
	}
	cu.Release()
	stopTimer(l)
	return nil
}

// stopTimer stops l's timer, if armed. Caller holds l.op.
func stopTimer(l *Live) {
	l.update(func() {
		if l.timer != nil {
			l.timer.Stop()
		}
	})
}

// upperTar is the file of a paused image that holds a sandbox's files.
const upperTar = "rootfs-upper.tar"

// pauseFiles saves a running sandbox's files (not its memory) to disk and
// destroys its box. On failure l runs as it did. Caller holds l.op.
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
	l.update(func() { l.box, l.rec.PausedImage, l.rec.PauseMode = nil, dir, sandbox.PauseFiles; l.spills++ })
	l.setPhase(spilled)
	cu.Add(func() {
		l.update(func() { l.box, l.rec.PausedImage, l.rec.PauseMode = b, "", "" })
		l.setPhase(running)
	})
	if err := m.put(ctx, l.rec); err != nil {
		return err
	}
	cu.Release()
	stopTimer(l)
	m.boxes.DestroyLater(b, 0)
	m.queuePausedUpload(l.rec.ID)
	m.log.Info("sandbox paused, its files only", "sandbox.id", l.rec.ID)
	return nil
}

// spill writes a frozen sandbox's state to disk and frees its memory. The
// frozen box stays until the image is recorded (a checkpoint of a paused
// box leaves it paused), so a crash at any point leaves one complete
// state; on failure l stays frozen as it was. Caller holds l.op.
func (m *Manager) spill(ctx context.Context, l *Live) error {
	t0 := time.Now()
	img := m.pausedDir(l.rec.ID)
	if err := m.checkpoint(ctx, l, img); err != nil {
		return err
	}
	cu := cleanup.Make(func() { os.RemoveAll(img) })
	defer cu.Clean()
	old := l.box
	l.update(func() { l.phase, l.box, l.rec.PausedImage = spilled, nil, img; l.spills++ })
	cu.Add(func() { l.update(func() { l.phase, l.box, l.rec.PausedImage = frozen, old, "" }) })
	if err := m.put(ctx, l.rec); err != nil {
		return err
	}
	cu.Release()
	stopTimer(l)
	timing.Since(ctx, "spill", t0)
	m.boxes.DestroyLater(old, 0)
	m.queuePausedUpload(l.rec.ID)
	m.log.Info("paused sandbox moved to disk", "sandbox.id", l.rec.ID, "bytes", box.ImageSize(img))
	return nil
}

// register adds l to the live set, watches its box, and arms its timer:
// expiry if running (an expired one fires at once), the move to disk if
// frozen in memory.
func (m *Manager) register(l *Live) {
	l.op.Lock()
	if l.box != nil {
		m.watchBox(l, l.box)
	}
	switch l.phase {
	case running:
		m.armTimer(l)
	case frozen:
		m.scheduleSpill(l)
	}
	l.op.Unlock()
	m.add(l)
}

// armTimer (re)schedules expiry at l.rec.EndAt. Caller holds l.op.
func (m *Manager) armTimer(l *Live) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
	}
	id := l.rec.ID
	l.timer = time.AfterFunc(time.Until(l.rec.EndAt), func() { m.expire(l, id) })
}

// expire pauses or kills a sandbox whose time is up, as its record says.
func (m *Manager) expire(l *Live, id string) {
	l.mu.Lock()
	due := l.phase == running && !time.Now().Before(l.rec.EndAt)
	pause := l.rec.OnTimeout == "pause"
	l.mu.Unlock()
	if !due { // extended or paused meanwhile, or already gone
		return
	}
	m.log.Info("sandbox timed out", "sandbox.id", id, "action", map[bool]string{true: "pause", false: "kill"}[pause])
	var err error
	if pause {
		err = m.Pause(context.Background(), id, sandbox.PauseRequest{FilesOnly: l.record().AutoPauseFiles})
	} else {
		err = m.Kill(context.Background(), id)
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrAlreadyExists) {
		m.log.Error("handling timed-out sandbox", "sandbox.id", id, "err", err)
	}
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
