package codeinterp

import (
	"context"
	"errors"
	"time"
)

// errRemoved is returned for executions queued on a context that was
// deleted meanwhile.
var errRemoved = errors.New("the context was removed")

// spawner describes the kernel a context needs.
type spawner func(ctx context.Context, c *codeContext) (spawnSpec, error)

// codeContext is one code context: an id and a kernel process started on
// demand. Safe for concurrent use; executions are serialized by run.
type codeContext struct {
	id       string
	language string
	cwd      string
	seq      uint64 // creation order, for listing

	run chan struct{} // one slot: held by the running execution

	mu      chan struct{} // one slot: guards k and removed; held while a kernel starts
	k       *kernel
	removed bool
}

// contextInfo is the wire form of a context.
type contextInfo struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func newCodeContext(id, lang, cwd string, seq uint64) *codeContext {
	return &codeContext{
		id: id, language: lang, cwd: cwd, seq: seq,
		run: make(chan struct{}, 1), mu: make(chan struct{}, 1),
	}
}

func (c *codeContext) info() contextInfo {
	return contextInfo{ID: c.id, Language: c.language, Cwd: c.cwd}
}

// acquire takes the run slot, writing keepalive lines while it waits. It
// returns false if ctx ended first.
func (c *codeContext) acquire(ctx context.Context, out *ndjson, every time.Duration) bool {
	select {
	case c.run <- struct{}{}:
		return true
	default:
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case c.run <- struct{}{}:
			return true
		case <-ctx.Done():
			return false
		case <-tick.C:
			out.write(keepaliveLine)
		}
	}
}

func (c *codeContext) release() { <-c.run }

// lock takes c.mu unless ctx ends first.
func (c *codeContext) lock(ctx context.Context) error {
	select {
	case c.mu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *codeContext) unlock() { <-c.mu }

// kernel returns the context's live kernel, starting a new one (fresh
// state) if there is none or the last one died.
func (c *codeContext) kernel(ctx context.Context, spawn spawner) (*kernel, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.unlock()
	if c.removed {
		return nil, errRemoved
	}
	if c.k != nil && !c.k.exited() {
		return c.k, nil
	}
	spec, err := spawn(ctx, c)
	if err != nil {
		return nil, err
	}
	// Not cancelled with the request: whoever runs next uses this kernel.
	k, err := startKernel(context.WithoutCancel(ctx), spec)
	if err != nil {
		return nil, err
	}
	c.k = k
	return k, nil
}

// restart replaces the kernel with a fresh one. A running execution ends
// with UnexpectedEndOfExecution.
func (c *codeContext) restart(ctx context.Context, spawn spawner) error {
	if err := c.lock(ctx); err != nil {
		return err
	}
	old := c.k
	c.k = nil
	c.unlock()
	if old != nil {
		old.stop(stopTimeout)
	}
	_, err := c.kernel(ctx, spawn)
	return err
}

// remove kills the kernel; the context cannot be used afterwards.
func (c *codeContext) remove() {
	c.mu <- struct{}{}
	c.removed = true
	k := c.k
	c.k = nil
	<-c.mu
	if k != nil {
		k.stop(stopTimeout)
	}
}

const stopTimeout = 5 * time.Second
