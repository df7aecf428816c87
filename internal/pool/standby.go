package pool

import (
	"context"
	"slices"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Standbys. A snapshot that was used once (created from, rolled back to)
// is likely to be used again: an agent's search returns to the same state
// many times. For the Config.Standbys snapshots used last, the pool keeps
// one box restored from it, with the limits it was last used with, and
// freezes it as soon as its agent answers. The next create or rollback from
// that snapshot resumes it (a few ms) instead of restoring (about 180 ms).
// Its state is the snapshot's: frozen right after the restore, it has run
// no longer than a restored box runs before its hand-off.

// standby is one snapshot's entry; guarded by Pool.mu.
type standby struct {
	id, image, rootfs string
	limits            sandbox.Limits
	box               *box.Box // frozen, ready to resume; nil while missing
	filling           bool
	dropped           bool // evicted, failed, or its snapshot deleted
}

// UseStandby records that snapshot id (its image on rootfs) was just used
// with limits: it gets (or keeps) a standby, and the least recently used one
// past the bound loses its own.
func (p *Pool) UseStandby(id, image, rootfs string, limits sandbox.Limits) {
	if p.cfg.Standbys <= 0 {
		return
	}
	var gone []*box.Box
	p.mu.Lock()
	i := slices.IndexFunc(p.standbys, func(s *standby) bool { return s.id == id })
	s := &standby{id: id, image: image, rootfs: rootfs, limits: limits}
	if i >= 0 {
		s = p.standbys[i]
		p.standbys = slices.Delete(p.standbys, i, i+1)
		if s.limits != limits && s.box != nil {
			gone = append(gone, s.box)
			s.box = nil
		}
		s.limits = limits
	}
	p.standbys = append(p.standbys, s)
	for len(p.standbys) > p.cfg.Standbys {
		gone = append(gone, p.forget(p.standbys[0])...)
	}
	p.mu.Unlock()
	p.destroyAll(gone)
	p.poke()
}

// takeStandby hands out the frozen standby of snapshot id if it was
// restored with limits, or nil.
func (p *Pool) takeStandby(id string, limits sandbox.Limits) *box.Box {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.standbys {
		if s.id == id && s.box != nil && s.limits == limits {
			b := s.box
			s.box = nil
			return b
		}
	}
	return nil
}

// ResumeStandby takes snapshot id's standby for limits and thaws it; nil
// if there is none (or it would not thaw, and is gone).
func (p *Pool) ResumeStandby(ctx context.Context, id string, limits sandbox.Limits) *box.Box {
	b := p.takeStandby(id, limits)
	if b == nil {
		return nil
	}
	cu := cleanup.Make(func() { p.f.Destroy(context.WithoutCancel(ctx), b) })
	defer cu.Clean()
	if err := p.f.Resume(ctx, b); err != nil {
		p.log.Warn("resuming a standby", "snapshot.id", id, "err", err)
		return nil
	}
	cu.Release()
	return b
}

// frozenBox restores a standby's snapshot and freezes it once its agent
// answers; nothing is left of it on failure.
func (p *Pool) frozenBox(ctx context.Context, s *standby, limits sandbox.Limits) (*box.Box, error) {
	b, err := p.restore(ctx, s.image, s.rootfs, limits, sandbox.Limits{}, true)
	if err != nil {
		return nil, err
	}
	cu := cleanup.Make(func() { p.f.Destroy(context.WithoutCancel(ctx), b) })
	defer cu.Clean()
	if err := p.f.Ready(ctx, b, limits); err != nil {
		return nil, err
	}
	if err := p.f.Pause(ctx, b); err != nil {
		return nil, err
	}
	cu.Release()
	return b, nil
}

// DropStandby forgets snapshot id's standby (the snapshot is deleted).
func (p *Pool) DropStandby(id string) {
	p.mu.Lock()
	var gone []*box.Box
	if i := slices.IndexFunc(p.standbys, func(s *standby) bool { return s.id == id }); i >= 0 {
		gone = p.forget(p.standbys[i])
	}
	p.mu.Unlock()
	p.destroyAll(gone)
}

// forget removes s and returns its box to destroy. Caller holds p.mu.
func (p *Pool) forget(s *standby) []*box.Box {
	p.standbys = slices.DeleteFunc(p.standbys, func(o *standby) bool { return o == s })
	s.dropped = true
	if b := s.box; b != nil {
		s.box = nil
		return []*box.Box{b}
	}
	return nil
}

func (p *Pool) destroyAll(bs []*box.Box) {
	for _, b := range bs {
		p.f.DestroyLater(b, 0)
	}
}

// nextStandby picks a standby to fill, most recently used first, marks it
// filling and returns it with the limits to fill it with; nil if none is
// missing.
func (p *Pool) nextStandby() (*standby, sandbox.Limits) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range slices.Backward(p.standbys) {
		if s.box == nil && !s.filling {
			s.filling = true
			return s, s.limits
		}
	}
	return nil, sandbox.Limits{}
}

// fillStandby restores s's snapshot (image and rootfs never change) with
// limits and freezes it once its agent answers.
func (p *Pool) fillStandby(ctx context.Context, s *standby, limits sandbox.Limits) {
	b, err := p.frozenBox(ctx, s, limits)
	p.mu.Lock()
	s.filling = false
	if err != nil {
		// Forgotten, not retried (its snapshot may be gone); the next use
		// of the snapshot asks again.
		if !s.dropped {
			p.forget(s)
		}
		p.mu.Unlock()
		p.log.Warn("preparing a standby", "snapshot.id", s.id, "err", err)
		return
	}
	keep := !s.dropped && s.limits == limits && p.stopped.Err() == nil
	if keep {
		s.box = b
	}
	p.mu.Unlock()
	if !keep {
		p.f.Destroy(context.Background(), b)
	}
}
