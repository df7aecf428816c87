// Package box makes, hands off and destroys boxes. A box is one runtime
// instance: a gVisor sandbox in its own network, and the transport that
// reaches its ports. A sandbox id (internal/manager) holds one box at a
// time; rollback and merge swap in another.
//
// The Factory is the only code that starts, restores, checkpoints or
// destroys a box, and HandOff is the only way a box is given to a sandbox
// (its network policy, its process limits, its identity and environment).
// The Factory knows nothing of sandboxes, the pool or the manager.
package box

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/failpoint"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// Box is one runtime instance. Its exported fields never change; Limits,
// and the policy and process limits HandOff applied, are guarded by the
// box's owner (the pool, or the sandbox that holds it).
type Box struct {
	RID       string // runtime id: fixed length, never a prefix of another
	Rootfs    string
	Net       sandbox.Net
	Transport *http.Transport // every connection goes to a port inside the box

	limits sandbox.Limits
	// ctx ends when the box is destroyed, cutting requests still in flight
	// to it (their sockets would otherwise wait on a peer that is gone).
	ctx    context.Context
	cancel context.CancelFunc
	// policy is the network policy installed (nil: none yet, egress
	// refused); rlimits are the process limits (PidsMax, OpenFiles) the
	// agent has applied (zero: none yet, the image's own).
	policy  *sandbox.Network
	rlimits sandbox.Limits
	// trusts: the agent was given the egress CA (it stays in the box's
	// files, so a checkpoint of the box keeps it too).
	trusts bool
	// background: the box runs as idle CPU work until it is handed off
	// (sandbox.Spec.Background): a shell, or a box the pool made.
	background bool
}

// Limits returns the limits the box runs with.
func (b *Box) Limits() sandbox.Limits { return b.limits }

// Rlimits returns the process limits (PidsMax, OpenFiles) the box's agent
// applied to its processes; zero: none, the image's own.
func (b *Box) Rlimits() sandbox.Limits { return b.rlimits }

// Alive returns a context that ends when the box is destroyed.
func (b *Box) Alive() context.Context { return b.ctx }

func newBox(rid, rootfs string, limits sandbox.Limits, n sandbox.Net) *Box {
	ctx, cancel := context.WithCancel(context.Background())
	return &Box{RID: rid, Rootfs: rootfs, limits: limits, Net: n, Transport: newTransport(n), ctx: ctx, cancel: cancel}
}

// newTransport returns an HTTP transport whose every connection goes to a
// port inside the box ("sandbox:<port>" in the request URL).
func newTransport(n sandbox.Net) *http.Transport {
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

// Config is what every box of a daemon shares.
type Config struct {
	DataDir string
	// NetPrefix starts the names of this daemon's networks ("cf<hash of
	// the data dir>-"), so that daemons on other data directories keep
	// theirs.
	NetPrefix string
	// AgentPath is the agent's executable inside boxes.
	AgentPath string
	// InitRlimits are the process limits every box boots with (and so every
	// template image has): the maximums, which HandOff lowers to each
	// sandbox's own.
	InitRlimits sandbox.Limits
	// MaxUploadBytes is told to every agent at hand-off.
	MaxUploadBytes int64
	// EgressCA is the certificate (PEM) of the CA the network presents
	// for hosts with network rules; boxes whose policy has rules are told
	// to trust it at hand-off (empty: none).
	EgressCA []byte
}

// Factory makes and destroys boxes. Safe for concurrent use.
type Factory struct {
	cfg    Config
	rt     sandbox.Runtime
	nets   sandbox.Networks
	agent  Agent
	log    *slog.Logger
	images imageRefs

	closing   chan struct{}  // closed by Close
	destroyer sync.WaitGroup // DestroyLater's
	closeOnce sync.Once
}

// NewFactory returns a Factory.
func NewFactory(cfg Config, rt sandbox.Runtime, nets sandbox.Networks, agent Agent, log *slog.Logger) *Factory {
	return &Factory{cfg: cfg, rt: rt, nets: nets, agent: agent, log: log, closing: make(chan struct{})}
}

// Runtime returns the runtime boxes run on.
func (f *Factory) Runtime() sandbox.Runtime { return f.rt }

// Agent returns the client of the boxes' agents.
func (f *Factory) Agent() Agent { return f.agent }

func (f *Factory) bundleDir(rid string) string { return filepath.Join(f.cfg.DataDir, "runtimes", rid) }

func (f *Factory) netName(rid string) string { return f.cfg.NetPrefix + rid }

// spec is the runtime spec of a box. Every box runs the agent with the
// same arguments, so any checkpoint restores into any box of its rootfs.
func (f *Factory) spec(b *Box, extraEnv ...string) sandbox.Spec {
	return sandbox.Spec{
		RuntimeID:   b.RID,
		BundleDir:   f.bundleDir(b.RID),
		Rootfs:      b.Rootfs,
		Args:        []string{f.cfg.AgentPath},
		Env:         append(agentEnv(), extraEnv...),
		NetnsPath:   b.Net.SandboxPath(),
		Limits:      b.limits,
		InitRlimits: f.cfg.InitRlimits,
		Background:  b.background,
	}
}

// agentEnv is the agent's boot environment. It must not depend on the
// daemon's configuration: a warm image or snapshot booted by one daemon is
// restored by others, so per-daemon settings go through HandOff.
func agentEnv() []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LANG=C.UTF-8",
	}
}

// BootKey identifies the boot configuration a template's warm image of
// disk size diskMB freezes: the agent's environment, the process limits it
// boots with, the disk size, and the layout (/tmp on the root overlay, a
// sized /dev/shm, the agent's CAP_SYS_RESOURCE, set-user-ID programs
// allowed). CPUs and memory are not frozen.
func (f *Factory) BootKey(diskMB int) string {
	rl := f.cfg.InitRlimits
	return fmt.Sprintf("%q rlimits=%d/%d disk=%d layout=4", agentEnv(), rl.PidsMax, rl.OpenFiles, diskMB)
}

// newRID returns a fresh runtime id.
func newRID() string { return sandbox.RandomHex(12) }

// create allocates a runtime id and a network for a box.
func (f *Factory) create(ctx context.Context, rootfs string, limits sandbox.Limits) (*Box, error) {
	defer timing.Since(ctx, "netns", time.Now())
	if err := failpoint.Inject(failpoint.Netns); err != nil {
		return nil, err
	}
	rid := newRID()
	n, err := f.nets.Create(f.netName(rid))
	if err != nil {
		return nil, err
	}
	return newBox(rid, rootfs, limits, n), nil
}

// Boot starts a fresh box running the agent (no checkpoint involved) and
// returns once the agent accepts connections. With upper (a tar
// ExportFiles wrote; "" none) its root filesystem starts with those
// changes over rootfs.
func (f *Factory) Boot(ctx context.Context, rootfs string, limits sandbox.Limits, upper string, extraEnv ...string) (*Box, error) {
	b, err := f.create(ctx, rootfs, limits)
	if err != nil {
		return nil, err
	}
	cu := cleanup.Make(func() { f.Destroy(context.WithoutCancel(ctx), b) })
	defer cu.Clean()
	spec := f.spec(b, extraEnv...)
	spec.RootfsUpper = upper
	if err := f.rt.Start(ctx, spec); err != nil {
		return nil, err
	}
	if err := f.agent.WaitUp(ctx, b); err != nil {
		return nil, err
	}
	cu.Release()
	return b, nil
}

// Prepare creates a box that runs nothing yet, to restore into (a shell).
// It is made ahead of need: it runs in the background (see Restore).
func (f *Factory) Prepare(ctx context.Context, rootfs string, limits sandbox.Limits) (*Box, error) {
	b, err := f.create(ctx, rootfs, limits)
	if err != nil {
		return nil, err
	}
	b.background = true
	cu := cleanup.Make(func() { f.Destroy(context.WithoutCancel(ctx), b) })
	defer cu.Clean()
	if err := f.rt.Prepare(ctx, f.spec(b)); err != nil {
		return nil, err
	}
	cu.Release()
	return b, nil
}

// Restore starts a box from a checkpoint image, into shell (a prepared box
// of the same rootfs and size) if not nil, else into a new one. The image
// decides the disk size and the process limits: limits must agree (see
// manager/source.go). frozen are the limits of the sandbox the image was
// taken of, whose process limits (PidsMax, OpenFiles) its hand-off applied
// and the image's processes keep, so that a hand-off with the same ones
// does not apply them again; zero for an image whose processes have the
// boot's (a template's warm image). The image is not deleted while it is
// read (RemoveImage waits). On failure shell is destroyed too.
//
// A background restore (a box made ahead of need) runs as idle CPU work
// until the box is handed off, so that it yields the CPUs to running
// sandboxes; any other brings a background shell to the foreground first.
func (f *Factory) Restore(ctx context.Context, image, rootfs string, limits, frozen sandbox.Limits, shell *Box, background bool) (*Box, error) {
	f.images.acquire(image)
	defer f.images.release(image)
	b := shell
	cu := cleanup.Make(func() {
		if b != nil {
			f.Destroy(context.WithoutCancel(ctx), b)
		}
	})
	defer cu.Clean()
	if b != nil {
		if err := f.fitPids(ctx, b, limits); err != nil {
			return nil, err
		}
		if !background {
			if err := f.foreground(ctx, b); err != nil {
				return nil, err
			}
		}
	} else {
		var err error
		if b, err = f.create(ctx, rootfs, limits); err != nil {
			return nil, err
		}
		b.background = background
	}
	err := failpoint.Inject(failpoint.Restore)
	if err == nil {
		err = f.rt.Restore(ctx, f.spec(b), image, shell != nil)
	}
	if err != nil {
		return nil, fmt.Errorf("restoring %s: %w", filepath.Base(image), err)
	}
	if err := f.agent.WaitUp(ctx, b); err != nil {
		return nil, err
	}
	b.rlimits = rlimitsOf(frozen)
	cu.Release()
	return b, nil
}

// Checkpoint writes b's whole state to a temporary directory and renames it
// to path, so that a crash never leaves a half-written image there. Unless
// leaveRunning, b stops and must then be destroyed.
func (f *Factory) Checkpoint(ctx context.Context, b *Box, path string, leaveRunning bool) error {
	return f.CheckpointRID(ctx, b.RID, path, leaveRunning)
}

// CheckpointRID is Checkpoint of a runtime that has no Box (one adopted
// mid pause after a crash).
func (f *Factory) CheckpointRID(ctx context.Context, rid, path string, leaveRunning bool) error {
	tmp := path + ".tmp-" + sandbox.RandomHex(4)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	err := failpoint.Inject(failpoint.Checkpoint)
	if err == nil {
		err = f.rt.Checkpoint(ctx, rid, tmp, leaveRunning)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

// Complete reports whether dir holds a finished checkpoint image.
func Complete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "checkpoint.img"))
	return dir != "" && err == nil
}

// ImageSize is the bytes an image directory holds of its own. Its
// base-*.img are the images it references instead of holding their pages
// (internal/runtime/gvisor/bases.go): hard links to files other images
// hold, which cost no disk and are not counted, or copies (of an image that
// was in memory or on another filesystem), which are.
func ImageSize(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && strings.HasPrefix(e.Name(), "base-") && st.Nlink > 1 {
			continue
		}
		n += fi.Size()
	}
	return n
}

// ExportFiles writes what b changed in its root filesystem (files written,
// changed and deleted) as a tar to path, which Boot can start a box from.
func (f *Factory) ExportFiles(ctx context.Context, b *Box, path string) error {
	if err := failpoint.Inject(failpoint.Checkpoint); err != nil {
		return err
	}
	return f.rt.ExportRootfs(ctx, b.RID, path)
}

// Pause freezes b in memory.
func (f *Factory) Pause(ctx context.Context, b *Box) error { return f.rt.Pause(ctx, b.RID) }

// Resume thaws a frozen b; a background one (a standby) first comes to
// the foreground.
func (f *Factory) Resume(ctx context.Context, b *Box) error {
	if err := failpoint.Inject(failpoint.Resume); err != nil {
		return err
	}
	if err := f.foreground(ctx, b); err != nil {
		return err
	}
	return f.rt.Resume(ctx, b.RID)
}

// Stats samples b's resource usage.
func (f *Factory) Stats(ctx context.Context, b *Box) (sandbox.Stats, error) {
	return f.rt.Stats(ctx, b.RID)
}

// Watch calls onExit once when b's runtime exits, whatever the cause (its
// own destroy included).
func (f *Factory) Watch(ctx context.Context, b *Box, onExit func()) error {
	return f.rt.Watch(ctx, f.bundleDir(b.RID), onExit)
}

// Destroy frees everything b holds; it keeps going past errors.
func (f *Factory) Destroy(ctx context.Context, b *Box) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	b.cancel()
	b.Transport.CloseIdleConnections()
	errs := []error{f.rt.Destroy(ctx, b.RID), b.Net.Destroy(), os.RemoveAll(f.bundleDir(b.RID))}
	if err := errors.Join(errs...); err != nil {
		f.log.Error("destroying runtime", "runtime.id", b.RID, "err", err)
		return err
	}
	return nil
}

// DestroyLater destroys b off the caller's path, after delay (at once when
// the factory closes); Close waits for it.
func (f *Factory) DestroyLater(b *Box, delay time.Duration) {
	f.destroyer.Add(1)
	go func() {
		defer f.destroyer.Done()
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-f.closing:
		}
		f.Destroy(context.Background(), b)
	}()
}

// Close destroys the boxes DestroyLater holds, now, and waits for them.
func (f *Factory) Close() {
	f.closeOnce.Do(func() { close(f.closing) })
	f.destroyer.Wait()
}

// Adopt takes over a box that runs after a daemon restart: its network is
// opened again. The caller states its policy again (SetPolicy).
func (f *Factory) Adopt(rid, rootfs string, limits sandbox.Limits) (*Box, error) {
	n, err := f.nets.Open(f.netName(rid))
	if err != nil {
		return nil, err
	}
	return newBox(rid, rootfs, limits, n), nil
}

// Release forgets b without destroying it (the daemon exits; the next one
// adopts it): its network's services stop, the box keeps running.
func (f *Factory) Release(b *Box) {
	b.Transport.CloseIdleConnections()
	b.Net.Close()
}

// DestroyRID frees what a runtime id holds when there is no box for it: the
// runtime, its network, its bundle.
func (f *Factory) DestroyRID(ctx context.Context, rid string) error {
	return errors.Join(f.rt.Destroy(ctx, rid), f.nets.Remove(f.netName(rid)), os.RemoveAll(f.bundleDir(rid)))
}

// Sweep destroys every runtime, network and bundle of this daemon whose
// runtime id keep does not claim (what a crash left behind).
func (f *Factory) Sweep(ctx context.Context, keep func(rid string) bool) error {
	var errs []error
	rids, err := f.rt.List(ctx)
	errs = append(errs, err)
	for _, rid := range rids {
		if !keep(rid) {
			f.log.Warn("removing unknown runtime", "runtime.id", rid)
			errs = append(errs, f.rt.Destroy(ctx, rid))
		}
	}
	names, err := f.nets.List(f.cfg.NetPrefix)
	errs = append(errs, err)
	for _, name := range names {
		if !keep(strings.TrimPrefix(name, f.cfg.NetPrefix)) {
			errs = append(errs, f.nets.Remove(name))
		}
	}
	entries, _ := os.ReadDir(filepath.Join(f.cfg.DataDir, "runtimes"))
	for _, e := range entries {
		if !keep(e.Name()) {
			errs = append(errs, os.RemoveAll(filepath.Join(f.cfg.DataDir, "runtimes", e.Name())))
		}
	}
	return errors.Join(errs...)
}

// RemoveImage deletes an image directory now, or once the last restore
// reading it (or hold of it) is done.
func (f *Factory) RemoveImage(path string) { f.images.remove(path) }

// HoldImage keeps RemoveImage from deleting path until the returned func is
// called.
func (f *Factory) HoldImage(path string) (release func()) {
	f.images.acquire(path)
	return func() { f.images.release(path) }
}

// imageRefs counts restores reading each image, so that deleting an image
// waits until the last one is done. Safe for concurrent use.
type imageRefs struct {
	mu     sync.Mutex
	n      map[string]int
	doomed map[string]bool
}

func (r *imageRefs) acquire(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n, r.doomed = map[string]int{}, map[string]bool{}
	}
	r.n[path]++
}

func (r *imageRefs) release(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n[path]--; r.n[path] <= 0 {
		delete(r.n, path)
		if r.doomed[path] {
			delete(r.doomed, path)
			_ = os.RemoveAll(path)
		}
	}
}

func (r *imageRefs) remove(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n[path] > 0 {
		r.doomed[path] = true
		return
	}
	_ = os.RemoveAll(path)
}
