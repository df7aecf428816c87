// Package manager owns every sandbox state transition: create, kill,
// timeouts, snapshot, fork, rollback, merge, pause, resume and connect,
// network policy, noticing sandboxes that die, and reconciling with what
// really runs after a daemon restart. Boxes (runtime instances) come from
// internal/box and the pool (internal/pool); the manager keeps the
// sandboxes' state machine (state.go) and their records. It knows nothing
// about HTTP; internal/api translates.
package manager

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/failpoint"
	"github.com/cellfork/cellfork/internal/pool"
	"github.com/cellfork/cellfork/internal/sandbox"
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
	// frozen standby (internal/pool); 0 turns standbys off.
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
	// RuntimeBuild identifies what restores only images it wrote: the
	// runtime's build (runsc's version) and, on a cluster host, the built-in
	// template's artifact ("<build>+base.<root>"). It keys the warm images.
	RuntimeBuild string
	// ForkDir holds fork's images, which live from the fork's checkpoint
	// until its children are restored: memory (tmpfs) when there is some,
	// so that a fork never goes through the data disk. Default
	// DataDir/forks.
	ForkDir string
	// SpillAfter is how long a paused sandbox stays frozen in memory before
	// its state is written to disk and its memory freed.
	SpillAfter time.Duration
	// EgressCA is the certificate (PEM) of the CA the sandboxes' networks
	// present for hosts with network rules (empty: none).
	EgressCA []byte
	// StoreGCInterval is how often the chunk store is collected (0:
	// never); StoreGCGrace is how old what no snapshot names must be
	// before a collection deletes it (images.go).
	StoreGCInterval time.Duration
	StoreGCGrace    time.Duration
}

// Templates gives the built-in templates' root filesystems and warm-image
// keys (internal/template).
type Templates interface {
	Rootfs(ctx context.Context, name string, progress io.Writer) (string, error)
	WarmKey(name, runtime, boot string) (string, error)
}

// Deps are what the manager runs on.
type Deps struct {
	Runtime   sandbox.Runtime
	Store     sandbox.Store
	Networks  sandbox.Networks
	Agent     box.Agent
	Templates Templates
	Log       *slog.Logger
	// IDs mints ids and tokens (nil: sandbox.RandomIDs, a single host's).
	IDs sandbox.IDs
	// Images is where snapshot images are uploaded to and imported from
	// (nil: nowhere; a snapshot lives in the data directory only).
	Images ImageStore
	// Cluster is what the other hosts of a cluster share with this one
	// (nil: a single host). Needs Images: images travel through it.
	Cluster Cluster
}

// Cluster is the rest of a cluster, as a host sees it
// (internal/clusterhost).
type Cluster interface {
	// FindSnapshot returns the record of a snapshot of team that another
	// host took, by id or name: ErrNotFound if there is none.
	FindSnapshot(ctx context.Context, team, idOrName string) (*sandbox.Snapshot, error)
	// MovedHere returns the record of a sandbox the cluster moved to this
	// host from another: a paused one (its PausedRoot names its image in
	// the store), or a running one a merge across hosts hands a child's
	// box (Assume). ErrNotFound if the cluster has none such.
	MovedHere(ctx context.Context, id string) (*sandbox.Sandbox, error)
	// StoreRoots claims this round of the shared chunk store's collection
	// (one host collects each round, every so often) and returns the
	// roots the cluster keeps: its snapshots' and paused sandboxes'
	// images. ok is false when the round is another host's.
	StoreRoots(ctx context.Context, every time.Duration) (roots []string, ok bool, err error)
	// WarmImage returns the root of the warm image published for a
	// built-in template's warm key ("" if none yet); PublishWarm records
	// root for it unless another host did first, and returns the root on
	// record.
	WarmImage(ctx context.Context, name, key string) (string, error)
	PublishWarm(ctx context.Context, name, key, root string) (string, error)
}

// Manager owns the live sandboxes. Safe for concurrent use.
type Manager struct {
	cfg   Config
	boxes *box.Factory
	pool  *pool.Pool
	adm   *pool.Admission
	st    sandbox.Store
	tpl   Templates
	ids   sandbox.IDs
	log   *slog.Logger
	// custom resolves templates built at runtime (custom.go; nil: none).
	custom  CustomTemplates
	images  ImageStore // nil: none
	cluster Cluster    // nil: a single host
	up      *uploads
	// bg is the background work's context (uploads, collections),
	// cancelled by Close.
	bg     context.Context
	cancel context.CancelFunc

	// Lock order (a lock may be taken while holding only those above it):
	//
	//	uploads.exclusive (images.go)
	//	  Live.op (two at most, in id order: Merge)
	//	    a snapshot's import lock (images.go)
	//	      Live.mu
	//	        snap
	//	          mu, and the pool's and the box factory's own (leaves)
	//
	// Nothing holding snap or mu waits for a sandbox: code that visits
	// every sandbox copies the live set under mu, releases it, then locks
	// each Live in turn.
	mu    sync.Mutex
	live  map[string]*Live // guarded by mu
	tombs map[string]tomb  // guarded by mu: sandboxes that died on their own
	snap  sync.Mutex       // serializes snapshot bookkeeping (names, tree)

	closing chan struct{} // closed by Close
	loops   sync.WaitGroup
}

// New returns a Manager. Call Reconcile, then Start, before serving.
func New(cfg Config, d Deps) *Manager {
	sum := sha256.Sum256([]byte(cfg.DataDir))
	boxes := box.NewFactory(box.Config{
		DataDir: cfg.DataDir, NetPrefix: "cf" + hex.EncodeToString(sum[:3]) + "-", AgentPath: cfg.AgentPath,
		InitRlimits:    sandbox.Limits{PidsMax: cfg.MaxLimits.PidsMax, OpenFiles: cfg.MaxLimits.OpenFiles},
		MaxUploadBytes: cfg.MaxUploadBytes, EgressCA: cfg.EgressCA,
	}, d.Runtime, d.Networks, d.Agent, d.Log)
	p := pool.New(boxes, pool.Config{
		Ready: cfg.PoolReady, Shells: cfg.PoolShells, Standbys: cfg.StandbySnapshots,
		StartConcurrency: cfg.StartConcurrency, StartQueue: cfg.StartQueue, StartWait: cfg.StartWait,
	}, d.Log)
	ids := d.IDs
	if ids == nil {
		ids = sandbox.RandomIDs{}
	}
	bg, cancel := context.WithCancel(context.Background())
	return &Manager{cfg: cfg, boxes: boxes, pool: p, adm: p.Admission(), st: d.Store, tpl: d.Templates, ids: ids, log: d.Log,
		images: d.Images, cluster: d.Cluster, up: newUploads(), bg: bg, cancel: cancel,
		live: map[string]*Live{}, tombs: map[string]tomb{}, closing: make(chan struct{})}
}

// Start warms the built-in template and starts the pool's refills.
func (m *Manager) Start(ctx context.Context) error {
	m.pool.Start()
	m.loops.Go(m.sampleLoop)
	m.startImages(ctx)
	if err := m.Warm(ctx, "base"); err != nil {
		// Creates still work: they boot instead of restoring.
		m.log.Error("no warm image; creates will boot", "template", "base", "err", err)
	}
	return nil
}

// Close stops the timers and the pool (destroying pooled boxes). Sandboxes
// keep running; the next daemon adopts them.
func (m *Manager) Close() {
	close(m.closing)
	m.cancel()
	m.loops.Wait()
	m.pool.Close()
	m.boxes.Close()
	for _, l := range m.lives() {
		l.mu.Lock()
		if l.timer != nil {
			l.timer.Stop()
		}
		if l.box != nil {
			m.boxes.Release(l.box)
		}
		l.mu.Unlock()
	}
}

// lives returns the live sandboxes (copied out under mu).
func (m *Manager) lives() []*Live {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Values(m.live))
}

// lookup returns the live sandbox or a NotFound error.
func (m *Manager) lookup(ctx context.Context, id string) (*Live, error) {
	l, err := m.find(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) && m.cluster != nil && !errors.Is(err, sandbox.ErrDied) {
		// Perhaps a paused sandbox the cluster moved here (travel.go).
		if aerr := m.adoptMoved(ctx, id); aerr == nil {
			return m.find(ctx, id)
		} else if !errors.Is(aerr, errdefs.ErrNotFound) {
			return nil, aerr
		}
	}
	return l, err
}

// find is lookup among the sandboxes this host holds.
func (m *Manager) find(ctx context.Context, id string) (*Live, error) {
	m.mu.Lock()
	l := m.live[id]
	m.mu.Unlock()
	if l != nil && !sandbox.Sees(ctx, l.team()) {
		l = nil // another team's: as good as absent
	}
	if l == nil {
		if msg := m.diedMessage(id); msg != "" {
			return nil, errors.Join(errdefs.New(errdefs.ErrNotFound, "%s", msg), sandbox.ErrDied)
		}
		return nil, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	return l, nil
}

// begin starts an operation on sandbox id that accepts the phases allowed:
// it returns the sandbox with op held (the caller unlocks it), or the
// error the operation gets in the sandbox's phase. doing names the
// operation in messages ("taking a snapshot of it").
func (m *Manager) begin(ctx context.Context, id, doing string, allowed ...phase) (*Live, error) {
	l, err := m.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	l.op.Lock()
	if err := l.require(doing, allowed...); err != nil {
		l.op.Unlock()
		return nil, err
	}
	return l, nil
}

// register adds l to the live set, watches its box, and arms its timer:
// expiry if running (an expired one fires at once), the move to disk if
// frozen in memory.
func (m *Manager) register(l *Live) {
	l.op.Lock()
	if l.box != nil {
		m.watchBox(l, l.box)
	}
	switch l.phase {
	case running:
		m.armTimer(l)
	case frozen:
		m.scheduleSpill(l)
	}
	l.op.Unlock()
	m.mu.Lock()
	m.live[l.rec.ID] = l
	m.mu.Unlock()
}

// exists reports whether a sandbox id is live, whatever its team.
func (m *Manager) exists(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[id] != nil
}

// Get returns a copy of the sandbox's record.
func (m *Manager) Get(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	l, err := m.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	return l.record(), nil
}

// List returns copies of every sandbox's record (of the request's team),
// oldest first.
func (m *Manager) List(ctx context.Context) ([]*sandbox.Sandbox, error) {
	lives := m.lives()
	out := make([]*sandbox.Sandbox, 0, len(lives))
	for _, l := range lives {
		if rec := l.record(); rec != nil && sandbox.Sees(ctx, rec.Team) {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b *sandbox.Sandbox) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return compareStrings(a.ID, b.ID)
	})
	return out, nil
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

// Kill destroys a sandbox and everything it holds.
func (m *Manager) Kill(ctx context.Context, id string) error {
	l, err := m.begin(ctx, id, "killing it", running, frozen, spilled)
	if err != nil {
		return err
	}
	defer l.op.Unlock()
	b := m.forget(l)
	return m.teardown(context.WithoutCancel(ctx), l.rec, b)
}

// forget makes l dead, drops it from the live set and returns its box.
// Caller holds l.op.
func (m *Manager) forget(l *Live) *box.Box {
	l.mu.Lock()
	b := l.box
	l.phase, l.box = dead, nil
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	m.mu.Lock()
	delete(m.live, l.rec.ID)
	m.mu.Unlock()
	return b
}

// teardown frees a sandbox's box, paused image and record. It keeps going
// past errors so that as much as possible is freed.
func (m *Manager) teardown(ctx context.Context, rec *sandbox.Sandbox, b *box.Box) error {
	var errs []error
	if b != nil {
		errs = append(errs, m.boxes.Destroy(ctx, b))
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

// put writes a sandbox's record (a failpoint for tests).
func (m *Manager) put(ctx context.Context, rec *sandbox.Sandbox) error {
	if err := failpoint.Inject(failpoint.StorePut); err != nil {
		return err
	}
	return m.st.Put(ctx, rec)
}

// SetTimeout makes the sandbox expire d from now (0: now).
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	if err := m.checkTimeout(d, true); err != nil {
		return err
	}
	l, err := m.begin(ctx, id, "changing its timeout", running, frozen, spilled)
	if err != nil {
		return err
	}
	defer l.op.Unlock()
	return m.setEnd(ctx, l, time.Now().UTC().Add(d))
}

// ExtendTimeout makes the sandbox expire no earlier than d from now (connect
// and refresh never shorten a sandbox's life).
func (m *Manager) ExtendTimeout(ctx context.Context, id string, d time.Duration) error {
	if err := m.checkTimeout(d, false); err != nil {
		return err
	}
	l, err := m.begin(ctx, id, "extending its timeout", running, frozen, spilled)
	if err != nil {
		return err
	}
	defer l.op.Unlock()
	return m.extend(ctx, l, d)
}

// extend is ExtendTimeout's transition. Caller holds l.op.
func (m *Manager) extend(ctx context.Context, l *Live, d time.Duration) error {
	end := time.Now().UTC().Add(d)
	if end.Before(l.rec.EndAt) {
		return nil
	}
	return m.setEnd(ctx, l, end)
}

// setEnd stores a new expiry and re-arms the timer. Caller holds l.op.
func (m *Manager) setEnd(ctx context.Context, l *Live, end time.Time) error {
	old := l.rec.EndAt
	l.update(func() { l.rec.EndAt = end })
	if err := m.put(ctx, l.rec); err != nil {
		l.update(func() { l.rec.EndAt = old })
		return err
	}
	if l.phase == running {
		m.armTimer(l)
	}
	return nil
}

// checkTimeout bounds a timeout; zero is allowed (expire now) where zeroOK.
func (m *Manager) checkTimeout(d time.Duration, zeroOK bool) error {
	if d < 0 || (d == 0 && !zeroOK) || d > m.cfg.MaxTimeout {
		lo := 1
		if zeroOK {
			lo = 0
		}
		return errdefs.New(errdefs.ErrInvalidArgument, "timeout must be between %d and %d seconds", lo, int(m.cfg.MaxTimeout.Seconds()))
	}
	return nil
}

// armTimer (re)schedules expiry at l.rec.EndAt. Caller holds l.op.
func (m *Manager) armTimer(l *Live) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
	}
	id := l.rec.ID
	l.timer = time.AfterFunc(time.Until(l.rec.EndAt), func() { m.expire(l, id) })
}

func (m *Manager) expire(l *Live, id string) {
	l.mu.Lock()
	due := l.phase == running && !time.Now().Before(l.rec.EndAt)
	pause := l.rec.OnTimeout == "pause"
	l.mu.Unlock()
	if !due { // extended or paused meanwhile, or already gone
		return
	}
	m.log.Info("sandbox timed out", "sandbox.id", id, "action", map[bool]string{true: "pause", false: "kill"}[pause])
	var err error
	if pause {
		err = m.Pause(context.Background(), id, sandbox.PauseRequest{FilesOnly: l.record().AutoPauseFiles})
	} else {
		err = m.Kill(context.Background(), id)
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrAlreadyExists) {
		m.log.Error("handling timed-out sandbox", "sandbox.id", id, "err", err)
	}
}

// PoolStats reports what the pool keeps ready.
func (m *Manager) PoolStats() sandbox.PoolStats {
	st := m.pool.Stats()
	return sandbox.PoolStats{Ready: st.Ready, Shells: st.Shells, Standbys: st.Standbys}
}

// Drop kills a sandbox this host must not run any longer (a cluster host's
// copy of a sandbox that moved on, or over its team's bound), and
// remembers why, for the id's later callers.
func (m *Manager) Drop(ctx context.Context, id, why string) {
	l, err := m.begin(context.Background(), id, "dropping it", running, frozen, spilled)
	if err != nil {
		return
	}
	defer l.op.Unlock()
	b := m.forget(l)
	m.mu.Lock()
	m.tombs[id] = tomb{reason: "dropped: " + why, at: time.Now()}
	m.mu.Unlock()
	m.log.Warn("sandbox dropped", "sandbox.id", id, "why", why)
	_ = m.teardown(context.WithoutCancel(ctx), l.rec, b)
}
