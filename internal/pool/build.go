package pool

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// BootBuild starts a box for a template build: a step's sandbox on its
// overlay (writable), or the finished template to warm. It takes a start
// slot while it boots, and gets the default network policy (builds fetch
// packages).
func (p *Pool) BootBuild(ctx context.Context, rootfs string, limits sandbox.Limits, writable bool, env ...string) (*BuildBox, error) {
	release, err := p.adm.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	var b *box.Box
	if writable {
		b, err = p.f.BootWritable(ctx, rootfs, limits, env...)
	} else {
		b, err = p.f.Boot(ctx, rootfs, limits, "", env...)
	}
	if err != nil {
		return nil, err
	}
	cu := cleanup.Make(func() { p.f.Destroy(context.WithoutCancel(ctx), b) })
	defer cu.Clean()
	if err := p.f.SetPolicy(b, sandbox.DefaultNetwork); err != nil {
		return nil, err
	}
	cu.Release()
	return &BuildBox{p: p, b: b}, nil
}

// BuildBox is a box a template build runs in. Destroy it when done.
type BuildBox struct {
	p    *Pool
	b    *box.Box
	once sync.Once
}

// Transport reaches the box's ports ("http://sandbox:<port>").
func (x *BuildBox) Transport() http.RoundTripper { return x.b.Transport }

// Checkpoint saves the box's whole state into dir (which must not exist)
// and stops it.
func (x *BuildBox) Checkpoint(ctx context.Context, dir string) error {
	x.b.Transport.CloseIdleConnections()
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("checkpoint directory %s exists", dir)
	}
	defer x.p.adm.Busy()()
	return x.p.f.Checkpoint(ctx, x.b, dir, false)
}

// Destroy frees the box (once; later calls do nothing).
func (x *BuildBox) Destroy(ctx context.Context) {
	x.once.Do(func() { x.p.f.Destroy(ctx, x.b) })
}
