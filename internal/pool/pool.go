// Package pool keeps boxes ready ahead of need, and decides when starts
// run:
//
//   - ready boxes per template, restored from its warm image with the
//     template's limits and handed their defaults (policy, process limits);
//   - prepared shells (runsc create: nothing running yet) to restore any
//     image of their rootfs and size into;
//   - snapshot standbys (standby.go): for the snapshots used last, one box
//     restored from each and frozen, resumed in a few ms by the next create
//     or rollback from it;
//   - admission (admission.go): a bound on concurrent starts, a queue with a
//     deadline, and the rule that background refills run only while no
//     request starts or checkpoints a box;
//   - template builds' boxes (build.go), started under admission.
//
// It depends on the box factory only; it knows nothing of sandboxes.
package pool

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Config sizes the pool.
type Config struct {
	Ready    int // ready boxes per template with a warm image
	Shells   int // prepared shells
	Standbys int // snapshots that keep a standby; 0 turns standbys off
	// StartConcurrency bounds concurrent starts; StartQueue and StartWait
	// bound how many wait and for how long before a 503.
	StartConcurrency int
	StartQueue       int
	StartWait        time.Duration
}

// Warm is a template's warm image and the limits its ready boxes get.
type Warm struct {
	Rootfs string
	Image  string
	Limits sandbox.Limits
	// Ready, if set, is how many ready boxes to keep of it instead of
	// Config.Ready (a custom template's own number, possibly 0).
	Ready *int
}

// Pool is safe for concurrent use.
type Pool struct {
	f   *box.Factory
	adm *Admission
	cfg Config
	log *slog.Logger

	kick    chan struct{}
	stopped context.Context // done once the pool is closed
	stop    context.CancelFunc
	done    chan struct{}

	mu           sync.Mutex
	ready        map[string][]*box.Box // template name -> boxes; guarded by mu
	shells       []*box.Box            // guarded by mu
	warm         map[string]Warm       // guarded by mu
	readyBackoff time.Time             // guarded by mu: after a failed refill, shells go first
	shellRootfs  string                // guarded by mu: rootfs the shells are prepared on
	shellLimits  sandbox.Limits        // guarded by mu
	standbys     []*standby            // guarded by mu; least recently used first (standby.go)
}

// New returns a pool; Start starts its refills.
func New(f *box.Factory, cfg Config, log *slog.Logger) *Pool {
	stopped, stop := context.WithCancel(context.Background())
	p := &Pool{
		f: f, cfg: cfg, log: log,
		kick: make(chan struct{}, 1), stopped: stopped, stop: stop, done: make(chan struct{}),
		ready: map[string][]*box.Box{}, warm: map[string]Warm{},
	}
	p.adm = NewAdmission(max(cfg.StartConcurrency, 1), max(cfg.StartQueue, 1), cfg.StartWait, p.poke)
	return p
}

// Admission returns the pool's admission, which every start takes a slot
// of.
func (p *Pool) Admission() *Admission { return p.adm }

// Start starts refilling.
func (p *Pool) Start() { go p.run() }

// SetWarm registers a template's warm image; the pool then keeps ready
// boxes of it, and shells on its rootfs.
func (p *Pool) SetWarm(name string, w Warm) {
	p.mu.Lock()
	p.warm[name] = w
	if p.shellRootfs == "" {
		p.shellRootfs, p.shellLimits = w.Rootfs, w.Limits
	}
	p.mu.Unlock()
	p.poke()
}

// RemoveWarm forgets a template's warm image and destroys its ready boxes
// (off the caller's path).
func (p *Pool) RemoveWarm(name string) {
	p.mu.Lock()
	delete(p.warm, name)
	bs := p.ready[name]
	delete(p.ready, name)
	p.mu.Unlock()
	for _, b := range bs {
		p.f.DestroyLater(b, 0)
	}
}

// Warm returns the template's warm image, if it has one.
func (p *Pool) Warm(name string) (Warm, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.warm[name]
	return w, ok
}

func (p *Pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// TakeReady hands out a ready box of the template, or nil.
func (p *Pool) TakeReady(name string) *box.Box {
	p.mu.Lock()
	defer p.mu.Unlock()
	bs := p.ready[name]
	if len(bs) == 0 {
		return nil
	}
	b := bs[len(bs)-1]
	p.ready[name] = bs[:len(bs)-1]
	p.poke()
	return b
}

// Restore restores image into a prepared shell when one fits (its rootfs,
// CPUs and memory), else into a new box; frozen are the limits of the
// sandbox the image is of (box.Factory.Restore).
func (p *Pool) Restore(ctx context.Context, image, rootfs string, limits, frozen sandbox.Limits) (*box.Box, error) {
	return p.restore(ctx, image, rootfs, limits, frozen, false)
}

// restore is Restore, in the background for the pool's own boxes (ready
// boxes, standbys): they run as idle CPU work until handed off, so that
// refills take only what running sandboxes leave of the CPUs.
func (p *Pool) restore(ctx context.Context, image, rootfs string, limits, frozen sandbox.Limits, background bool) (*box.Box, error) {
	return p.f.Restore(ctx, image, rootfs, limits, frozen, p.takeShell(rootfs, limits), background)
}

func (p *Pool) takeShell(rootfs string, limits sandbox.Limits) *box.Box {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.shells) == 0 || rootfs != p.shellRootfs || !limits.SameSize(p.shellLimits) {
		return nil
	}
	b := p.shells[len(p.shells)-1]
	p.shells = p.shells[:len(p.shells)-1]
	p.poke()
	return b
}

// next says what the pool lacks most: a ready box of some template (name
// != ""), a shell (shell), or nothing.
func (p *Pool) next() (name string, w Warm, shell bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, img := range p.warm {
		target := p.cfg.Ready
		if img.Ready != nil {
			target = *img.Ready
		}
		if len(p.ready[n]) < target && time.Now().After(p.readyBackoff) {
			return n, img, false
		}
	}
	return "", Warm{}, p.shellRootfs != "" && len(p.shells) < p.cfg.Shells
}

// run refills the pool until stopped.
func (p *Pool) run() {
	defer close(p.done)
	for {
		select {
		case <-p.stopped.Done():
			return
		case <-p.kick:
		case <-time.After(time.Second):
		}
		for p.fillOne() {
		}
	}
}

// fillTimeout bounds how long the pool waits for one box to come up.
const fillTimeout = 30 * time.Second

// fillOne adds one ready box, shell or standby; false when there is
// nothing to do, no slot is free, or it failed (the next tick retries).
func (p *Pool) fillOne() bool {
	name, w, shell := p.next()
	// Ready boxes and shells are what requests take next: they refill as
	// soon as nothing runs. Standbys are a guess: they wait a moment more.
	speculative := name == "" && !shell
	release, ok := p.adm.TryAcquire(speculative)
	if !ok {
		return false
	}
	defer release()
	// A box that does not come up in time is given up on: the fill loop
	// (and the daemon's shutdown, which waits for it) never hangs on one.
	ctx, cancel := context.WithTimeout(p.stopped, fillTimeout)
	defer cancel()
	switch {
	case speculative:
		s, limits := p.nextStandby()
		if s == nil {
			return false
		}
		p.fillStandby(ctx, s, limits)
		return true
	case name != "":
		b, err := p.readyBox(ctx, w)
		if err != nil {
			p.log.Error("refilling pool", "template", name, "err", err)
			p.mu.Lock()
			p.readyBackoff = time.Now().Add(5 * time.Second)
			p.mu.Unlock()
			return true // shells may still be refilled
		}
		return p.add(func() bool {
			if cur, ok := p.warm[name]; !ok || cur.Image != w.Image {
				return false // the template went or changed meanwhile
			}
			p.ready[name] = append(p.ready[name], b)
			return true
		}, b)
	}
	p.mu.Lock()
	rootfs, limits := p.shellRootfs, p.shellLimits
	p.mu.Unlock()
	b, err := p.shell(ctx, rootfs, limits)
	if err != nil {
		p.log.Error("preparing shell", "err", err)
		return false
	}
	return p.add(func() bool { p.shells = append(p.shells, b); return true }, b)
}

// add stores b unless the pool was closed meanwhile.
func (p *Pool) add(store func() bool, b *box.Box) bool {
	p.mu.Lock()
	if p.stopped.Err() != nil || !store() {
		p.mu.Unlock()
		p.f.Destroy(context.Background(), b)
		return false
	}
	p.mu.Unlock()
	return true
}

// Close stops refilling and destroys every pooled box.
func (p *Pool) Close() {
	p.stop()
	<-p.done
	p.mu.Lock()
	var all []*box.Box
	for _, bs := range p.ready {
		all = append(all, bs...)
	}
	all = append(all, p.shells...)
	for len(p.standbys) > 0 {
		all = append(all, p.forget(p.standbys[0])...)
	}
	p.ready, p.shells = map[string][]*box.Box{}, nil
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, b := range all {
		wg.Go(func() { p.f.Destroy(context.Background(), b) })
	}
	wg.Wait()
}

// Stats is the pool's fill.
type Stats struct {
	Ready    map[string]int // per template
	Shells   int
	Standbys map[string]int // per snapshot: 1 when its standby is ready
}

// Stats reports the pool's fill.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Stats{Ready: map[string]int{}, Shells: len(p.shells), Standbys: map[string]int{}}
	for n, bs := range p.ready {
		st.Ready[n] = len(bs)
	}
	for _, s := range p.standbys {
		st.Standbys[s.id] = 0
		if s.box != nil {
			st.Standbys[s.id] = 1
		}
	}
	return st
}

// readyBox restores a template's warm image into a box that is ready to
// hand off; nothing is left of it on failure.
func (p *Pool) readyBox(ctx context.Context, w Warm) (*box.Box, error) {
	b, err := p.restore(ctx, w.Image, w.Rootfs, w.Limits, sandbox.Limits{}, true)
	if err != nil {
		return nil, err
	}
	cu := cleanup.Make(func() { p.f.Destroy(context.WithoutCancel(ctx), b) })
	defer cu.Clean()
	if err := p.f.Ready(ctx, b, w.Limits); err != nil {
		return nil, err
	}
	cu.Release()
	return b, nil
}

// shell prepares an empty box with the default network policy; nothing
// is left of it on failure.
func (p *Pool) shell(ctx context.Context, rootfs string, limits sandbox.Limits) (*box.Box, error) {
	b, err := p.f.Prepare(ctx, rootfs, limits)
	if err != nil {
		return nil, err
	}
	cu := cleanup.Make(func() { p.f.Destroy(context.WithoutCancel(ctx), b) })
	defer cu.Clean()
	if err := p.f.SetPolicy(b, sandbox.DefaultNetwork); err != nil {
		return nil, err
	}
	cu.Release()
	return b, nil
}
