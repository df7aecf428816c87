package manager

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// Limits on caller-supplied maps, so a request cannot bloat the store.
const (
	maxMapEntries = 128
	maxKeyLen     = 256
	maxValueLen   = 16 << 10
)

func validateMap(what string, m map[string]string, envStyle bool) error {
	if len(m) > maxMapEntries {
		return errdefs.New(errdefs.ErrInvalidArgument, "%s: at most %d entries", what, maxMapEntries)
	}
	for k, v := range m {
		switch {
		case k == "" || len(k) > maxKeyLen:
			return errdefs.New(errdefs.ErrInvalidArgument, "%s: keys must be 1-%d bytes", what, maxKeyLen)
		case len(v) > maxValueLen:
			return errdefs.New(errdefs.ErrInvalidArgument, "%s %q: value longer than %d bytes", what, k, maxValueLen)
		case strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0):
			return errdefs.New(errdefs.ErrInvalidArgument, "%s %q: NUL bytes are not allowed", what, k)
		case envStyle && strings.ContainsRune(k, '='):
			return errdefs.New(errdefs.ErrInvalidArgument, "%s %q: names must not contain '='", what, k)
		}
	}
	return nil
}

// normalize fills defaults and rejects what is out of bounds (limits aside:
// see createLimits).
func (m *Manager) normalize(req *sandbox.CreateRequest) error {
	if req.Timeout == 0 {
		req.Timeout = m.cfg.DefaultTimeout
	}
	if err := m.checkTimeout(req.Timeout, false); err != nil {
		return err
	}
	if err := validateMap("metadata", req.Metadata, false); err != nil {
		return err
	}
	if err := validateMap("envVars", req.Envs, true); err != nil {
		return err
	}
	if req.OnTimeout == "" {
		req.OnTimeout = "kill"
	}
	if req.AutoResume && req.OnTimeout != "pause" {
		return errdefs.New(errdefs.ErrInvalidArgument, "autoResume needs autoPause: only a sandbox that pauses on timeout can resume on traffic")
	}
	if req.AutoResume && req.AutoPauseFiles {
		return errdefs.New(errdefs.ErrInvalidArgument, "autoResume cannot be combined with autoPauseMemory false: traffic never reboots a sandbox")
	}
	if req.OnTimeout != "pause" {
		req.AutoPauseFiles = false // only a timeout pause takes it
	}
	if req.Network != nil {
		if _, err := sandbox.ParsePolicy(*req.Network); err != nil {
			return err
		}
	}
	return nil
}

// Create starts a new sandbox from a template or snapshot and returns its
// record once its agent answers. It takes a ready sandbox from the pool
// when it can, else a snapshot's standby, else restores the image, else
// boots; rec.BootMode says which. On failure nothing of it is left behind.
func (m *Manager) Create(ctx context.Context, req sandbox.CreateRequest) (*sandbox.Sandbox, error) {
	t0 := time.Now()
	id := req.ID
	if id == "" {
		id = m.ids.SandboxID()
	} else {
		if !m.ids.Own(id) {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "sandbox id %q is not one this host may take", id)
		}
		// Idempotent by id: a retried create answers the sandbox the
		// first one made (of the same team; another team's is a clash).
		if l, err := m.find(ctx, id); err == nil {
			return l.record(), nil
		}
		if m.exists(id) {
			return nil, errdefs.New(errdefs.ErrAlreadyExists, "sandbox id %q is taken", id)
		}
	}
	team, _ := sandbox.TeamOf(ctx)
	src, err := m.resolve(ctx, req.TemplateID)
	if err != nil {
		return nil, err
	}
	if sn := src.snapshot; sn != nil {
		envs := maps.Clone(sn.Envs)
		if envs == nil {
			envs = map[string]string{}
		}
		maps.Copy(envs, req.Envs)
		req.Envs = envs
	}
	if err := m.normalize(&req); err != nil {
		return nil, err
	}
	limits, err := m.createLimits(src, req.Limits)
	if err != nil {
		return nil, err
	}
	timing.Since(ctx, "resolve", t0)
	now := time.Now().UTC()
	rec := &sandbox.Sandbox{
		ID: id, Team: team, TemplateID: req.TemplateID,
		State: sandbox.StateRunning, StartedAt: now, EndAt: now.Add(req.Timeout),
		Metadata: orEmpty(req.Metadata), Envs: orEmpty(req.Envs),
		AccessToken: m.ids.Token(id), OnTimeout: req.OnTimeout, AutoResume: req.AutoResume,
		AutoPauseFiles: req.AutoPauseFiles, Rootfs: src.rootfs, ParentID: req.ParentID,
	}
	rec.SetLimits(limits)
	rec.Network = sandbox.DefaultNetwork
	if src.snapshot != nil {
		rec.BaseSnapshot, rec.Network = src.snapshot.ID, src.snapshot.Network.Clone()
	}
	if req.Network != nil {
		rec.Network = req.Network.Clone()
	}
	// Foreground until the hand-off is done: the admission slot is released
	// when the box runs, and a pool refill (a shell's `runsc create`, a
	// ready box's restore) started then took the CPUs from the new
	// sandbox's /init.
	defer m.adm.Busy()()
	b, mode, err := m.startBox(ctx, src, limits)
	if err != nil {
		return nil, err
	}
	rec.RuntimeID, rec.BootMode = b.RID, mode
	out, err := m.adopt(ctx, rec, b)
	if err != nil {
		return nil, err
	}
	if sn := src.snapshot; sn != nil && sn.Image != "" {
		m.pool.UseStandby(sn.ID, sn.Image, sn.Rootfs, limits)
	}
	m.log.Info("sandbox created", "sandbox.id", out.ID, "template", req.TemplateID, "mode", mode, "ms", time.Since(t0).Milliseconds())
	return out, nil
}

// startBox gets a running box for src with limits: from the pool, from a
// snapshot's standby, by restore, or by boot (see source.go for which
// limit allows which).
func (m *Manager) startBox(ctx context.Context, src source, limits sandbox.Limits) (*box.Box, string, error) {
	if src.image != "" && limits.DiskMB != src.limits.DiskMB {
		src.image = "" // a template's warm image has its disk size: boot one of the size asked for
	}
	if src.template != "" && src.image != "" && limits.SameSize(src.limits) && rlimitsFit(src.limits, limits) {
		if b := m.pool.TakeReady(src.template); b != nil {
			return b, "pool", nil
		}
	}
	if src.snapshot != nil {
		if b := m.pool.ResumeStandby(ctx, src.snapshot.ID, limits); b != nil {
			return b, "standby", nil
		}
	}
	t0 := time.Now()
	release, err := m.adm.Acquire(ctx)
	if err != nil {
		return nil, "", err
	}
	defer release()
	timing.Since(ctx, "queue", t0)
	if src.snapshot != nil {
		dir, done, err := m.snaps.Image(ctx, src.snapshot)
		if err != nil {
			return nil, "", err
		}
		defer done()
		b, err := m.pool.Restore(ctx, dir, src.rootfs, limits, src.limits)
		return b, "restore", err
	}
	if src.image != "" {
		b, err := m.pool.Restore(ctx, src.image, src.rootfs, limits, sandbox.Limits{})
		return b, "restore", err
	}
	b, err := m.boxes.Boot(ctx, src.rootfs, limits, "")
	return b, "boot", err
}

// adopt gives a running box to a new sandbox: the hand-off, the record
// stored, the box watched, the timer armed. It returns a copy of the
// record taken before the sandbox is published (others may change it
// from then on). On failure the box is destroyed and nothing is left.
func (m *Manager) adopt(ctx context.Context, rec *sandbox.Sandbox, b *box.Box) (*sandbox.Sandbox, error) {
	cu := cleanup.Make(func() { m.boxes.Destroy(context.WithoutCancel(ctx), b) })
	defer cu.Clean()
	if err := m.boxes.HandOff(ctx, b, m.handOff(rec)); err != nil {
		return nil, fmt.Errorf("initializing sandbox %s: %w", rec.ID, err)
	}
	t := time.Now()
	if err := m.put(ctx, rec); err != nil {
		return nil, err
	}
	timing.Since(ctx, "store", t)
	cu.Release()
	out := cloneRecord(rec)
	m.register(newLive(rec, b))
	return out, nil
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}
