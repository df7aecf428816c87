package box

import (
	"context"

	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// BootWritable starts a box for a template build step: like Boot, but the
// box writes straight to rootfs (the step's overlay mount, whose upper
// directory becomes the step's layer) instead of to an in-memory overlay.
// Such a box is never checkpointed.
func (f *Factory) BootWritable(ctx context.Context, rootfs string, limits sandbox.Limits, extraEnv ...string) (*Box, error) {
	b, err := f.create(ctx, rootfs, limits)
	if err != nil {
		return nil, err
	}
	cu := cleanup.Make(func() { f.Destroy(context.WithoutCancel(ctx), b) })
	defer cu.Clean()
	spec := f.spec(b, extraEnv...)
	spec.WritableRoot = true
	if err := f.rt.Start(ctx, spec); err != nil {
		return nil, err
	}
	if err := f.agent.WaitUp(ctx, b); err != nil {
		return nil, err
	}
	cu.Release()
	return b, nil
}
