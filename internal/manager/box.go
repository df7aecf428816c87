package manager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cellfork/cellfork/internal/netns"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// box is one runtime instance: a gVisor sandbox in its own network, and
// the transport that reaches its ports. A sandbox id keeps its box for its
// life, except that rollback and merge swap in another one.
type box struct {
	rid       string
	rootfs    string
	limits    sandbox.Limits
	net       *netns.Network
	transport *http.Transport
	// ctx ends when the box is destroyed, cutting requests still in flight
	// to it (their sockets would otherwise wait on a peer that is gone).
	ctx    context.Context
	cancel context.CancelFunc
	// policy is the network policy installed on the box (nil: none yet,
	// egress refused). Guarded by the owner: the pool, or the sandbox's mu.
	policy *sandbox.Network
	// rlimits are the process limits (PidsMax, OpenFiles) the agent has
	// applied; zero: none yet, the image's own. Guarded like policy.
	rlimits sandbox.Limits
}

func newBoxValue(rid, rootfs string, limits sandbox.Limits, n *netns.Network) *box {
	ctx, cancel := context.WithCancel(context.Background())
	return &box{rid: rid, rootfs: rootfs, limits: limits, net: n, transport: newTransport(n), ctx: ctx, cancel: cancel}
}

func (m *Manager) bundleDir(rid string) string {
	return filepath.Join(m.cfg.DataDir, "runtimes", rid)
}

func (m *Manager) netName(rid string) string { return m.netPrefix + rid }

// newTransport returns an HTTP transport whose every connection goes to a
// port inside the box ("sandbox:<port>" in the request URL).
func newTransport(n *netns.Network) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			_, p, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			port, err := strconv.Atoi(p)
			if err != nil {
				return nil, err
			}
			return n.Dial(ctx, port)
		},
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
}

// spec is the runtime spec of a box. Every box runs the agent with the
// same arguments, so any checkpoint restores into any box of its rootfs.
func (m *Manager) spec(b *box, extraEnv ...string) sandbox.Spec {
	return sandbox.Spec{
		RuntimeID:   b.rid,
		BundleDir:   m.bundleDir(b.rid),
		Rootfs:      b.rootfs,
		Args:        []string{m.cfg.AgentPath},
		Env:         append(agentEnv(), extraEnv...),
		NetnsPath:   b.net.SandboxPath(),
		Limits:      b.limits,
		InitRlimits: m.initRlimits(),
	}
}

// agentEnv is the agent's boot environment. It must not depend on the
// daemon's configuration: a warm image or snapshot booted by one daemon is
// restored by others, so per-daemon settings go through postInit.
func agentEnv() []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LANG=C.UTF-8",
	}
}

// bootKey identifies the boot configuration a template's warm image
// freezes: the agent's environment, the process limits it boots with, the
// disk size, and the layout (/tmp on the root overlay, a sized /dev/shm,
// the agent's CAP_SYS_RESOURCE, set-user-ID programs allowed). CPUs and
// memory are not frozen.
func (m *Manager) bootKey(name string) string {
	rl := m.initRlimits()
	return fmt.Sprintf("%q rlimits=%d/%d disk=%d layout=4", agentEnv(), rl.PidsMax, rl.OpenFiles, m.templateLimits(name).DiskMB)
}

// newBox allocates a runtime id and a network for a box.
func (m *Manager) newBox(ctx context.Context, rootfs string, limits sandbox.Limits) (*box, error) {
	defer timing.Since(ctx, "netns", time.Now())
	rid := randomHex(12)
	n, err := netns.Create(m.netName(rid), &m.netCfg)
	if err != nil {
		return nil, err
	}
	return newBoxValue(rid, rootfs, limits, n), nil
}

// bootBox starts a fresh box running the agent (no checkpoint involved).
func (m *Manager) bootBox(ctx context.Context, rootfs string, limits sandbox.Limits, extraEnv ...string) (*box, error) {
	b, err := m.newBox(ctx, rootfs, limits)
	if err != nil {
		return nil, err
	}
	if err := m.rt.Start(ctx, m.spec(b, extraEnv...)); err != nil {
		m.destroyBox(context.WithoutCancel(ctx), b)
		return nil, err
	}
	if err := waitAgent(ctx, b); err != nil {
		m.destroyBox(context.WithoutCancel(ctx), b)
		return nil, err
	}
	return b, nil
}

// prepareBox creates a box that runs nothing yet, to restore into.
func (m *Manager) prepareBox(ctx context.Context, rootfs string, limits sandbox.Limits) (*box, error) {
	b, err := m.newBox(ctx, rootfs, limits)
	if err != nil {
		return nil, err
	}
	if err := m.rt.Prepare(ctx, m.spec(b)); err != nil {
		m.destroyBox(context.WithoutCancel(ctx), b)
		return nil, err
	}
	return b, nil
}

// restoreBox starts a box from a checkpoint image: into a prepared shell
// from the pool when one fits, else into a new one. The image decides the
// disk size and the process limits (limits must agree: see limits.go).
func (m *Manager) restoreBox(ctx context.Context, image, rootfs string, limits sandbox.Limits) (*box, error) {
	b, prepared := m.pool.takeShell(rootfs, limits), true
	if b != nil {
		if err := m.fitPids(ctx, b, limits); err != nil {
			m.destroyBox(context.WithoutCancel(ctx), b)
			return nil, err
		}
	} else {
		var err error
		if b, err = m.newBox(ctx, rootfs, limits); err != nil {
			return nil, err
		}
		prepared = false
	}
	if err := m.rt.Restore(ctx, m.spec(b), image, prepared); err != nil {
		m.destroyBox(context.WithoutCancel(ctx), b)
		return nil, fmt.Errorf("restoring %s: %w", filepath.Base(image), err)
	}
	if err := waitAgent(ctx, b); err != nil {
		m.destroyBox(context.WithoutCancel(ctx), b)
		return nil, err
	}
	return b, nil
}

// destroyLater destroys b off the caller's path, after delay (at once when
// the manager closes); Close waits for it.
func (m *Manager) destroyLater(b *box, delay time.Duration) {
	m.destroyer.Add(1)
	go func() {
		defer m.destroyer.Done()
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-m.closing:
		}
		m.destroyBox(context.Background(), b)
	}()
}

// destroyBox frees everything a box holds; it keeps going past errors.
func (m *Manager) destroyBox(ctx context.Context, b *box) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	b.cancel()
	b.transport.CloseIdleConnections()
	errs := []error{m.rt.Destroy(ctx, b.rid), b.net.Destroy(), os.RemoveAll(m.bundleDir(b.rid))}
	if err := errors.Join(errs...); err != nil {
		m.log.Error("destroying runtime", "runtime.id", b.rid, "err", err)
		return err
	}
	return nil
}

// destroyRuntime frees what a runtime id holds when there is no box value
// for it (reconcile): the runsc container, its network, its bundle.
func (m *Manager) destroyRuntime(ctx context.Context, rid string) error {
	return errors.Join(m.rt.Destroy(ctx, rid), netns.Remove(m.netName(rid)), os.RemoveAll(m.bundleDir(rid)))
}

// waitAgent waits until the agent in b accepts connections. A restored
// agent answers at once; a booting one within tens of milliseconds.
func waitAgent(ctx context.Context, b *box) error {
	defer timing.Since(ctx, "agent", time.Now())
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for delay := 500 * time.Microsecond; ; delay = min(2*delay, 20*time.Millisecond) {
		// A short per-attempt deadline: until gVisor owns the interface a
		// SYN can be dropped, and the kernel's retransmit takes a second.
		dctx, dcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		c, err := b.net.Dial(dctx, EnvdPort)
		dcancel()
		if err == nil {
			c.Close()
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("agent did not start: %w", err)
		}
		time.Sleep(delay)
	}
}
