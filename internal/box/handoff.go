package box

import (
	"context"
	"reflect"
	"time"

	"github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/failpoint"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// HandOff is what a box gets when it is given to a sandbox.
type HandOff struct {
	// Policy is the sandbox's network policy.
	Policy sandbox.Network
	// Envs are the environment variables the agent gives commands and code
	// (the sandbox's identity variables among them); nil: none to add.
	Envs map[string]string
	// Limits are the sandbox's. CPUs, memory and disk must be the box's
	// already; its host pids bound is resized, and the agent lowers the
	// process limits, unless the box has exactly these.
	Limits sandbox.Limits
}

// HandOff gives b to a sandbox: the network policy, the limits and POST
// /init. It is the one way every path (pool, create, restore, rollback,
// resume, merge, fork children) hands a box over. What it applied is
// recorded on b, so a second hand-off of the same settings costs only the
// /init. The caller destroys b if it fails.
func (f *Factory) HandOff(ctx context.Context, b *Box, h HandOff) error {
	if err := f.foreground(ctx, b); err != nil {
		return err
	}
	return f.handOff(ctx, b, h)
}

// handOff is HandOff but for the box's CPU share: Ready's, for a box that
// stays in the background until a sandbox takes it.
func (f *Factory) handOff(ctx context.Context, b *Box, h HandOff) error {
	t0 := time.Now()
	if err := f.SetPolicy(b, h.Policy); err != nil {
		return err
	}
	timing.Since(ctx, "policy", t0)
	t0 = time.Now()
	defer timing.Since(ctx, "init", t0)
	if err := f.fitPids(ctx, b, h.Limits); err != nil {
		return err
	}
	// No default user: the agent keeps its image's (`user`, or the one a
	// custom template's warm image was given when it was made).
	init := envd.InitRequest{EnvVars: h.Envs, MaxUploadBytes: f.cfg.MaxUploadBytes}
	trust := f.needsTrust(b, h.Policy)
	if trust {
		init.CACert = string(f.cfg.EgressCA)
	}
	want := rlimitsOf(h.Limits)
	if b.rlimits != want {
		init.PidsMax, init.OpenFiles = int64(want.PidsMax), int64(want.OpenFiles)
	}
	if err := failpoint.Inject(failpoint.Init); err != nil {
		return err
	}
	if err := f.agent.Init(ctx, b, init); err != nil {
		return err
	}
	b.rlimits = want
	if trust {
		b.trusts = true
	}
	return nil
}

// rlimitsOf returns the process limits among l: what the agent applies.
func rlimitsOf(l sandbox.Limits) sandbox.Limits {
	return sandbox.Limits{PidsMax: l.PidsMax, OpenFiles: l.OpenFiles}
}

// Trust makes b's agent trust the daemon's egress CA if the policy n has
// network rules and it does not yet (HandOff does the same): for a policy
// given to a running box. Its processes started before keep their
// environment, but the system bundle they read changes.
func (f *Factory) Trust(ctx context.Context, b *Box, n sandbox.Network) error {
	if !f.needsTrust(b, n) {
		return nil
	}
	if err := f.agent.Init(ctx, b, envd.InitRequest{CACert: string(f.cfg.EgressCA)}); err != nil {
		return err
	}
	b.trusts = true
	return nil
}

// needsTrust says whether b's agent must be told to trust the egress CA
// for n: the daemon terminates TLS only for hosts with rules that set
// headers, so only sandboxes with such rules trust the CA.
func (f *Factory) needsTrust(b *Box, n sandbox.Network) bool {
	if b.trusts || len(f.cfg.EgressCA) == 0 {
		return false
	}
	for _, t := range n.Rules {
		if len(t.Headers) > 0 {
			return true
		}
	}
	return false
}

// Ready does to a box waiting in the pool what its hand-off would
// otherwise wait for: the default network policy and limits (most creates
// ask for those), and a kept-alive connection to the agent. A background
// box stays in the background until its HandOff.
func (f *Factory) Ready(ctx context.Context, b *Box, limits sandbox.Limits) error {
	if err := f.handOff(ctx, b, HandOff{Policy: sandbox.DefaultNetwork, Limits: limits}); err != nil {
		return err
	}
	return f.agent.Health(ctx, b)
}

// SetPolicy installs a network policy on b, unless it is there already.
func (f *Factory) SetPolicy(b *Box, n sandbox.Network) error {
	if b.policy != nil && reflect.DeepEqual(*b.policy, n) {
		return nil
	}
	p, err := sandbox.ParsePolicy(n)
	if err != nil {
		return err
	}
	if err := b.Net.SetPolicy(p); err != nil {
		return err
	}
	c := n.Clone()
	b.policy = &c
	return nil
}

// foreground gives a background box the normal CPU share.
func (f *Factory) foreground(ctx context.Context, b *Box) error {
	if !b.background {
		return nil
	}
	if err := f.rt.Foreground(ctx, b.RID); err != nil {
		return err
	}
	b.background = false
	return nil
}

// fitPids resizes b's host pids cgroup for l (the rest of l is b's
// already, or set by the agent at hand-off) and records l as b's limits.
func (f *Factory) fitPids(ctx context.Context, b *Box, l sandbox.Limits) error {
	if b.limits.PidsMax != l.PidsMax && l.PidsMax != 0 {
		if err := f.rt.SetPidsMax(ctx, b.RID, l.PidsMax); err != nil {
			return err
		}
	}
	if l != (sandbox.Limits{}) {
		b.limits = l
	}
	return nil
}
