// Package manager owns every sandbox state transition: create (from the
// pool, by restore, or by boot), kill, timeouts, snapshot, fork, rollback,
// pause/resume, merge, network policy, noticing sandboxes that die, and
// reconciling with what really runs after a daemon restart. It knows
// nothing about HTTP; internal/api translates.
package manager

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/netns"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
)

// Ports the agent serves inside every sandbox.
const (
	EnvdPort            = 49983
	CodeInterpreterPort = 49999
)

// Config is the manager's part of the daemon configuration.
type Config struct {
	DataDir string
	// DefaultLimits are the limits of a sandbox whose template does not set
	// them (TemplateLimits) and whose create does not ask; a create may ask
	// for up to MaxLimits. Every field of both is set.
	DefaultLimits sandbox.Limits
	MaxLimits     sandbox.Limits
	// TemplateLimits are each built-in template's defaults, every field
	// set (a template missing here gets DefaultLimits).
	TemplateLimits map[string]sandbox.Limits
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	MaxUploadBytes int64
	// Pool sizes per template: sandboxes kept restored and ready, and
	// prepared shells to restore snapshots into.
	PoolReady  int
	PoolShells int
	// StandbySnapshots is how many of the snapshots used last keep a
	// frozen standby (standby.go); 0 turns standbys off.
	StandbySnapshots int
	// StartConcurrency bounds concurrent sandbox starts; StartQueue and
	// StartWait bound how many wait and for how long before a 503.
	StartConcurrency int
	StartQueue       int
	StartWait        time.Duration
	// SnapshotCapBytes refuses new snapshots once their images use this
	// much disk (0 = no cap). MaxFork bounds fork's count.
	SnapshotCapBytes int64
	MaxFork          int
	// AgentPath is the agent's executable inside sandboxes (per version:
	// template.Registry.AgentPath).
	AgentPath string
	// RuntimeBuild identifies the runtime's build (runsc's version), which
	// restores only images it wrote: it keys the warm images.
	RuntimeBuild string
	// ForkDir holds fork's images, which live from the fork's checkpoint
	// until its children are restored: memory (tmpfs) when there is some,
	// so that a fork never goes through the data disk. Default
	// DataDir/forks.
	ForkDir string
	// DNS are the upstream resolvers (host:port) that answer for the
	// sandboxes' resolvers.
	DNS []string
	// SpillAfter is how long a paused sandbox stays frozen in memory before
	// its state is written to disk and its memory freed.
	SpillAfter time.Duration
}

// Manager owns the live sandboxes. Safe for concurrent use.
type Manager struct {
	cfg Config
	rt  sandbox.Runtime
	st  sandbox.Store
	tpl *template.Registry
	log *slog.Logger

	adm    *admission
	pool   *pool
	images imageRefs
	netCfg netns.Config // what every sandbox network shares (set by Reconcile)

	// netPrefix starts the names of this daemon's network namespaces
	// ("cf<hash of the data dir>-<runtime id>-r/-s"), so that daemons on
	// other data directories keep theirs.
	netPrefix string

	// Lock order (a lock may be taken while holding only those before it):
	//
	//	Live.mu (two at most, in id order: Merge)
	//	  -> snap
	//	    -> pool.mu, imageRefs.mu, mu (leaves: nothing is taken under them)
	//
	// So nothing holding snap or mu waits for a sandbox: code that visits
	// every sandbox copies the live set under mu, releases it, then locks
	// each Live in turn.
	mu    sync.Mutex
	live  map[string]*Live // guarded by mu
	tombs map[string]tomb  // guarded by mu: sandboxes that died on their own
	snap  sync.Mutex       // serializes snapshot bookkeeping (cap, tree)

	closing   chan struct{}  // closed by Close
	destroyer sync.WaitGroup // destroys off the callers' paths (destroyLater)
}

// Live is a sandbox this daemon knows. Its lifecycle operations are
// serialized by mu.
type Live struct {
	mu      sync.Mutex
	rec     *sandbox.Sandbox // guarded by mu
	box     *box             // guarded by mu; nil while paused to disk
	timer   *time.Timer      // guarded by mu
	dead    bool             // guarded by mu: killed, must not be used
	lastCPU time.Duration    // guarded by mu
	lastAt  time.Time        // guarded by mu
}

// New returns a Manager. Call Reconcile, then Start, before serving.
func New(cfg Config, rt sandbox.Runtime, st sandbox.Store, tpl *template.Registry, log *slog.Logger) *Manager {
	sum := sha256.Sum256([]byte(cfg.DataDir))
	m := &Manager{cfg: cfg, rt: rt, st: st, tpl: tpl, log: log, live: map[string]*Live{}, tombs: map[string]tomb{},
		netPrefix: "cf" + hex.EncodeToString(sum[:3]) + "-", closing: make(chan struct{})}
	m.pool = newPool(m, cfg.PoolReady, cfg.PoolShells, cfg.StandbySnapshots)
	m.adm = newAdmission(max(cfg.StartConcurrency, 1), max(cfg.StartQueue, 1), cfg.StartWait, m.pool.poke)
	return m
}

// Start warms the built-in template and starts the pool's refill loop.
func (m *Manager) Start(ctx context.Context) error {
	go m.pool.run()
	if err := m.Warm(ctx, "base"); err != nil {
		// Creates still work: they boot instead of restoring.
		m.log.Error("no warm image; creates will boot", "template", "base", "err", err)
	}
	return nil
}

// newID returns a 20-character lowercase alphanumeric id, like E2B's.
func newID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	b[0] = alphabet[int(b[0])%26] // start with a letter
	return string(b)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// lookup returns the live sandbox or a NotFound error.
func (m *Manager) lookup(id string) (*Live, error) {
	m.mu.Lock()
	l := m.live[id]
	m.mu.Unlock()
	if l == nil {
		if msg := m.diedMessage(id); msg != "" {
			return nil, errdefs.New(errdefs.ErrNotFound, "%s", msg)
		}
		return nil, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	return l, nil
}

// Get returns a copy of the sandbox's record.
func (m *Manager) Get(_ context.Context, id string) (*sandbox.Sandbox, error) {
	l, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return cloneRecord(l.rec), nil
}

// List returns copies of every sandbox's record, oldest first.
func (m *Manager) List(_ context.Context) []*sandbox.Sandbox {
	m.mu.Lock()
	lives := slices.Collect(maps.Values(m.live))
	m.mu.Unlock()
	out := make([]*sandbox.Sandbox, 0, len(lives))
	for _, l := range lives {
		l.mu.Lock()
		out = append(out, cloneRecord(l.rec))
		l.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b *sandbox.Sandbox) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return compareStrings(a.ID, b.ID)
	})
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cloneRecord(r *sandbox.Sandbox) *sandbox.Sandbox {
	c := *r
	c.Metadata = maps.Clone(r.Metadata)
	c.Envs = maps.Clone(r.Envs)
	c.Network = cloneNetwork(r.Network)
	return &c
}

// Endpoint is how the proxy reaches a running sandbox: the transport to its
// ports, a copy of its record (for access checks), and a context that ends
// when the sandbox's current box goes away (killed, died, rolled back).
// A paused sandbox is ErrFailedPrecondition.
func (m *Manager) Endpoint(id string) (http.RoundTripper, *sandbox.Sandbox, context.Context, error) {
	l, err := m.locked(id)
	if err != nil {
		return nil, nil, nil, err
	}
	defer l.mu.Unlock()
	if l.rec.State != sandbox.StateRunning {
		return nil, cloneRecord(l.rec), nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q is paused: connect to resume it", id)
	}
	return l.box.transport, cloneRecord(l.rec), l.box.ctx, nil
}

// live returns the Live of id locked, or an error if it is gone. The caller
// unlocks l.mu.
func (m *Manager) locked(id string) (*Live, error) {
	l, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.dead {
		l.mu.Unlock()
		return nil, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	return l, nil
}

// Kill destroys a sandbox and everything it holds.
func (m *Manager) Kill(ctx context.Context, id string) error {
	l, err := m.locked(id)
	if err != nil {
		return err
	}
	defer l.mu.Unlock()
	m.forget(l)
	return m.teardown(context.WithoutCancel(ctx), l.rec, l.box)
}

// forget marks l dead and drops it from the live set. Caller holds l.mu.
func (m *Manager) forget(l *Live) {
	l.dead = true
	if l.timer != nil {
		l.timer.Stop()
	}
	m.mu.Lock()
	delete(m.live, l.rec.ID)
	m.mu.Unlock()
}

// teardown frees a sandbox's box, paused image and record. It keeps going
// past errors so that as much as possible is freed.
func (m *Manager) teardown(ctx context.Context, rec *sandbox.Sandbox, b *box) error {
	var errs []error
	if b != nil {
		errs = append(errs, m.destroyBox(ctx, b))
	}
	if rec.PausedImage != "" {
		errs = append(errs, os.RemoveAll(rec.PausedImage))
	}
	errs = append(errs, m.st.Delete(ctx, rec.ID))
	if err := errors.Join(errs...); err != nil {
		m.log.Error("tearing down sandbox", "sandbox.id", rec.ID, "err", err)
		return fmt.Errorf("tearing down sandbox %s: %w", rec.ID, err)
	}
	m.log.Info("sandbox killed", "sandbox.id", rec.ID)
	return nil
}

// SetTimeout makes the sandbox expire d from now.
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	if err := m.checkTimeout(d); err != nil {
		return err
	}
	l, err := m.locked(id)
	if err != nil {
		return err
	}
	defer l.mu.Unlock()
	return m.setEnd(ctx, l, time.Now().UTC().Add(d))
}

// ExtendTimeout makes the sandbox expire no earlier than d from now (connect
// and refresh never shorten a sandbox's life).
func (m *Manager) ExtendTimeout(ctx context.Context, id string, d time.Duration) error {
	if err := m.checkTimeout(d); err != nil {
		return err
	}
	l, err := m.locked(id)
	if err != nil {
		return err
	}
	defer l.mu.Unlock()
	end := time.Now().UTC().Add(d)
	if end.Before(l.rec.EndAt) {
		return nil
	}
	return m.setEnd(ctx, l, end)
}

// setEnd stores a new expiry and re-arms the timer. Caller holds l.mu.
func (m *Manager) setEnd(ctx context.Context, l *Live, end time.Time) error {
	old := l.rec.EndAt
	l.rec.EndAt = end
	if err := m.st.Put(ctx, l.rec); err != nil {
		l.rec.EndAt = old
		return err
	}
	if l.rec.State == sandbox.StateRunning {
		m.armTimer(l, l.rec.ID)
	}
	return nil
}

func (m *Manager) checkTimeout(d time.Duration) error {
	if d <= 0 || d > m.cfg.MaxTimeout {
		return errdefs.New(errdefs.ErrInvalidArgument, "timeout must be between 1 and %d seconds", int(m.cfg.MaxTimeout.Seconds()))
	}
	return nil
}

// armTimer (re)schedules expiry at l.rec.EndAt. Caller holds l.mu.
func (m *Manager) armTimer(l *Live, id string) {
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timer = time.AfterFunc(time.Until(l.rec.EndAt), func() { m.expire(l, id) })
}

func (m *Manager) expire(l *Live, id string) {
	l.mu.Lock()
	due := !l.dead && l.rec.State == sandbox.StateRunning && !time.Now().Before(l.rec.EndAt)
	pause := l.rec.OnTimeout == "pause"
	l.mu.Unlock()
	if !due { // extended or paused meanwhile, or already gone
		return
	}
	m.log.Info("sandbox timed out", "sandbox.id", id, "action", map[bool]string{true: "pause", false: "kill"}[pause])
	var err error
	if pause {
		err = m.Pause(context.Background(), id)
	} else {
		err = m.Kill(context.Background(), id)
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		m.log.Error("handling timed-out sandbox", "sandbox.id", id, "err", err)
	}
}

// PoolStats reports how many ready sandboxes per template, prepared shells
// and snapshot standbys the pool holds.
func (m *Manager) PoolStats() (ready map[string]int, shells int, standbys map[string]int) {
	return m.pool.stats()
}

// Close stops the timers and the pool (destroying pooled boxes). Sandboxes
// keep running; the next daemon adopts them.
func (m *Manager) Close() {
	m.pool.close()
	close(m.closing)
	m.destroyer.Wait()
	m.mu.Lock()
	lives := slices.Collect(maps.Values(m.live))
	m.mu.Unlock()
	for _, l := range lives {
		l.mu.Lock()
		if l.timer != nil {
			l.timer.Stop()
		}
		if l.box != nil {
			l.box.transport.CloseIdleConnections()
		}
		l.mu.Unlock()
	}
}
