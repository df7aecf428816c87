package manager

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// pool keeps sandboxes ready to hand out (restored from their template's
// warm image, agent up, not yet given to anyone) and prepared shells to
// restore snapshots into. A background loop refills both, using a start
// slot only when no foreground request waits for one. Safe for concurrent
// use.
type pool struct {
	m            *Manager
	readyTarget  int
	shellTarget  int
	kick         chan struct{}
	stopped      context.Context // done once the pool is closed
	stop         context.CancelFunc
	done         chan struct{}
	mu           sync.Mutex
	ready        map[string][]*box // template name -> boxes; guarded by mu
	shells       []*box            // guarded by mu
	warm         map[string]warmImage
	readyBackoff time.Time // guarded by mu: after a failed refill, shells go first
	shellRootfs  string    // rootfs the shells are prepared on
	shellLimits  sandbox.Limits
	standbys     []*standby // guarded by mu; least recently used first (standby.go)
	standbyMax   int
}

func newPool(m *Manager, readyTarget, shellTarget, standbyMax int) *pool {
	stopped, stop := context.WithCancel(context.Background())
	return &pool{
		m: m, readyTarget: readyTarget, shellTarget: shellTarget, standbyMax: standbyMax,
		kick: make(chan struct{}, 1), stopped: stopped, stop: stop, done: make(chan struct{}),
		ready: map[string][]*box{}, warm: map[string]warmImage{},
	}
}

// setWarm registers a template's warm image; the pool then keeps ready
// sandboxes of it, and shells on its rootfs.
func (p *pool) setWarm(name string, w warmImage) {
	p.mu.Lock()
	p.warm[name] = w
	if p.shellRootfs == "" {
		p.shellRootfs, p.shellLimits = w.rootfs, p.m.templateLimits(name)
	}
	p.mu.Unlock()
	p.poke()
}

func (p *pool) warmImage(name string) (warmImage, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.warm[name]
	return w, ok
}

func (p *pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// takeReady hands out a ready sandbox of the template, or nil.
func (p *pool) takeReady(name string) *box {
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

// takeShell hands out a prepared shell on rootfs of the size limits asks
// for, or nil.
func (p *pool) takeShell(rootfs string, limits sandbox.Limits) *box {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.shells) == 0 || rootfs != p.shellRootfs || !sameSize(limits, p.shellLimits) {
		return nil
	}
	b := p.shells[len(p.shells)-1]
	p.shells = p.shells[:len(p.shells)-1]
	p.poke()
	return b
}

// next says what the pool lacks most: a ready sandbox of some template
// (name != ""), a shell (shell), or nothing.
func (p *pool) next() (name string, w warmImage, shell bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, img := range p.warm {
		if len(p.ready[n]) < p.readyTarget && time.Now().After(p.readyBackoff) {
			return n, img, false
		}
	}
	return "", warmImage{}, p.shellRootfs != "" && len(p.shells) < p.shellTarget
}

// run refills the pool until stopped.
func (p *pool) run() {
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

// fillOne adds one ready sandbox or shell; false when there is nothing to
// do, no slot is free, or it failed (the next tick retries).
func (p *pool) fillOne() bool {
	name, w, shell := p.next()
	// Ready boxes and shells are what requests take next: they refill as
	// soon as nothing runs. Standbys are a guess: they wait a moment more.
	speculative := name == "" && !shell
	release, ok := p.m.adm.tryAcquire(speculative)
	if !ok {
		return false
	}
	defer release()
	// A box that does not come up in time is given up on: the fill loop
	// (and the daemon's shutdown, which waits for it) never hangs on one.
	ctx, cancel := context.WithTimeout(p.stopped, fillTimeout)
	defer cancel()
	if speculative {
		s, limits := p.nextStandby()
		if s == nil {
			return false
		}
		p.fillStandby(ctx, s, limits)
		return true
	}
	if name != "" {
		lim := p.m.templateLimits(name)
		b, err := p.m.restoreBox(ctx, w.image, w.rootfs, lim)
		if err == nil {
			err = p.m.readyForHandOff(ctx, b, lim)
		}
		if err != nil {
			p.m.log.Error("refilling pool", "template", name, "err", err)
			p.mu.Lock()
			p.readyBackoff = time.Now().Add(5 * time.Second)
			p.mu.Unlock()
			return true // shells may still be refilled
		}
		return p.add(func() { p.ready[name] = append(p.ready[name], b) }, b)
	}
	b, err := p.m.prepareBox(ctx, p.shellRootfs, p.shellLimits)
	if err == nil {
		if err = p.m.applyPolicy(b, sandbox.DefaultNetwork); err != nil {
			p.m.destroyBox(context.WithoutCancel(ctx), b)
		}
	}
	if err != nil {
		p.m.log.Error("preparing shell", "err", err)
		return false
	}
	return p.add(func() { p.shells = append(p.shells, b) }, b)
}

// readyForHandOff does now what a hand-off would otherwise wait for: the
// default network policy and the template's process limits (most creates
// ask for those), and a kept-alive connection to the agent.
func (m *Manager) readyForHandOff(ctx context.Context, b *box, lim sandbox.Limits) error {
	if err := m.applyPolicy(b, sandbox.DefaultNetwork); err != nil {
		m.destroyBox(context.WithoutCancel(ctx), b)
		return err
	}
	if err := m.applyRlimits(ctx, b, nil, lim); err != nil {
		m.destroyBox(context.WithoutCancel(ctx), b)
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://sandbox:%d/health", EnvdPort), nil)
	resp, err := b.transport.RoundTrip(req)
	if err != nil {
		m.destroyBox(context.WithoutCancel(ctx), b)
		return fmt.Errorf("the agent of a pooled sandbox does not answer: %w", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil
}

// add stores b unless the pool was closed meanwhile.
func (p *pool) add(store func(), b *box) bool {
	p.mu.Lock()
	select {
	case <-p.stopped.Done():
		p.mu.Unlock()
		p.m.destroyBox(context.Background(), b)
		return false
	default:
	}
	store()
	p.mu.Unlock()
	return true
}

// close stops refilling and destroys every pooled box.
func (p *pool) close() {
	p.stop()
	<-p.done
	p.mu.Lock()
	var all []*box
	for _, bs := range p.ready {
		all = append(all, bs...)
	}
	all = append(all, p.shells...)
	for len(p.standbys) > 0 {
		all = append(all, p.forget(p.standbys[0])...)
	}
	p.ready, p.shells = map[string][]*box{}, nil
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, b := range all {
		wg.Go(func() { p.m.destroyBox(context.Background(), b) })
	}
	wg.Wait()
}

// stats reports the pool's fill for /metrics-style reporting.
func (p *pool) stats() (ready map[string]int, shells int, standbys map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ready, standbys = map[string]int{}, map[string]int{}
	for n, bs := range p.ready {
		ready[n] = len(bs)
	}
	for _, s := range p.standbys {
		if s.box != nil {
			standbys[s.id] = 1
		} else {
			standbys[s.id] = 0
		}
	}
	return ready, len(p.shells), standbys
}
