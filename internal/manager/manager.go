// Package manager owns every sandbox state transition: create, kill,
// timeouts, snapshot, fork, rollback, merge, pause, resume and connect,
// network policy, noticing sandboxes that die, and reconciling with what
// really runs after a daemon restart. Boxes (runtime instances) come from
// internal/box and the pool (internal/pool); snapshot records and images
// (on disk and in the chunk store) from internal/snapshots; the built-in
// templates' warm images from internal/warm; resource samples from
// internal/samples. None of those knows the manager. The manager keeps the
// sandboxes' state machine (state.go) and their records. It knows nothing
// about HTTP; internal/api translates.
package manager

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/failpoint"
	"github.com/cellfork/cellfork/internal/pool"
	"github.com/cellfork/cellfork/internal/samples"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/snapshots"
	"github.com/cellfork/cellfork/internal/warm"
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
	// before a collection deletes it (internal/snapshots).
	StoreGCInterval time.Duration
	StoreGCGrace    time.Duration
}

// Deps are what the manager runs on.
type Deps struct {
	Runtime   sandbox.Runtime
	Store     sandbox.Store
	Networks  sandbox.Networks
	Agent     box.Agent
	Templates warm.Templates
	Log       *slog.Logger
	// IDs mints ids and tokens (nil: sandbox.RandomIDs, a single host's).
	IDs sandbox.IDs
	// Images is where snapshot images are uploaded to and imported from
	// (nil: nowhere; a snapshot lives in the data directory only).
	Images snapshots.ImageStore
	// Cluster is what the other hosts of a cluster share with this one
	// (nil: a single host). Needs Images: images travel through it.
	Cluster Cluster
}

// Cluster is the rest of a cluster, as a host sees it
// (internal/clusterhost).
type Cluster interface {
	snapshots.Cluster // other hosts' snapshots, the shared store's collection
	warm.Cluster      // the built-in templates' warm images
	// MovedHere returns the record of a sandbox the cluster moved to this
	// host from another: a paused one (its PausedRoot names its image in
	// the store), or a running one a merge across hosts hands a child's
	// box (Assume). ErrNotFound if the cluster has none such.
	MovedHere(ctx context.Context, id string) (*sandbox.Sandbox, error)
}

// The seam to custom templates (internal/templates): the manager resolves
// template ids it does not know through CustomTemplates, keeps ready
// sandboxes of the templates it is told to (WarmCustom), and starts the
// boxes template builds run in (BootBuild; the daemon adapts it to the
// builder's interface, so that the manager does not depend on the builder).

// CustomTemplate is a built template as the manager needs it.
type CustomTemplate struct {
	// Key names the build in the pool (one per build: a rebuild is a new
	// key, and sandboxes of the old one keep its root).
	Key    string
	Rootfs string
	Image  string // warm image: booted, start command running
	// Limits are its sandboxes' defaults; DiskMB is frozen in Image.
	Limits sandbox.Limits
}

// CustomTemplates resolves the ids of templates built at runtime.
type CustomTemplates interface {
	// ResolveTemplate returns the template id names ("name", "name:tag",
	// a template id), or an ErrNotFound error.
	ResolveTemplate(ctx context.Context, id string) (CustomTemplate, error)
	// LocalRoot returns this host's copy of root file system rootfs, which
	// a record from another host names (a custom template's root is at
	// another path on each host: this host's copy of the same build,
	// pulled for team if need be); another path as it is.
	LocalRoot(ctx context.Context, team, rootfs string) (string, error)
}

// Manager owns the live sandboxes. Safe for concurrent use.
//
// Its files are layers: each uses only what the files below it declare,
// from state.go (a sandbox's phase), manager.go (this, and what every
// operation shares) and live.go (the live set) up to the operations and
// reconcile.go (a daemon's start and stop). `go test -v -run Layered`
// prints the layers, and fails on files that use each other.
type Manager struct {
	cfg   Config
	boxes *box.Factory
	pool  *pool.Pool
	adm   *pool.Admission
	st    sandbox.Store
	tpl   warm.Templates
	ids   sandbox.IDs
	log   *slog.Logger
	// custom resolves templates built at runtime (nil: none).
	custom  CustomTemplates
	images  snapshots.ImageStore // nil: none
	cluster Cluster              // nil: a single host
	snaps   *snapshots.Snapshots
	warm    *warm.Maker
	samples *samples.History

	// Lock order (a lock may be taken while holding only those above it):
	//
	//	the uploads' (internal/snapshots: every upload Job runs under it)
	//	  Live.op (two at most, in id order: Merge)
	//	    an import's lock (snapshots.Lock)
	//	      Live.mu
	//	        the snapshot records' (internal/snapshots)
	//	          mu, and the pool's, the box factory's and the samples' own (leaves)
	//
	// Nothing holding mu waits for a sandbox: code that visits every
	// sandbox copies the live set under mu, releases it, then locks each
	// Live in turn.
	mu    sync.Mutex
	live  map[string]*Live // guarded by mu
	tombs map[string]tomb  // guarded by mu: sandboxes that died on their own

	closing chan struct{} // closed by Close
	loops   sync.WaitGroup
}

// tomb remembers why a sandbox is gone.
type tomb struct {
	reason string
	at     time.Time
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
	// (A nil Images or Cluster stays nil in the narrower interfaces.)
	wm := warm.New(cfg.RuntimeBuild, warm.Deps{Templates: d.Templates, Boxes: boxes, Admission: p.Admission(),
		Images: d.Images, Cluster: d.Cluster, Log: d.Log})
	m := &Manager{cfg: cfg, boxes: boxes, pool: p, adm: p.Admission(), st: d.Store, tpl: d.Templates, ids: ids, log: d.Log,
		images: d.Images, cluster: d.Cluster, warm: wm, samples: samples.New(boxes),
		live: map[string]*Live{}, tombs: map[string]tomb{}, closing: make(chan struct{})}
	m.snaps = snapshots.New(snapshots.Config{DataDir: cfg.DataDir, RuntimeBuild: cfg.RuntimeBuild, CapBytes: cfg.SnapshotCapBytes,
		GCInterval: cfg.StoreGCInterval, GCGrace: cfg.StoreGCGrace, LocalRoot: m.localRoot}, d.Store, boxes, d.Images, d.Cluster, d.Log)
	return m
}

// SetCustomTemplates installs the resolver of custom templates. Call it
// before serving.
func (m *Manager) SetCustomTemplates(c CustomTemplates) { m.custom = c }

// localRoot returns this host's copy of rootfs, the root file system a
// record from another host names: a custom template's root maps to this
// host's copy of its build (CustomTemplates.LocalRoot); a built-in
// template's is the same path on every host.
func (m *Manager) localRoot(ctx context.Context, team, rootfs string) (string, error) {
	if m.custom == nil {
		return rootfs, nil
	}
	local, err := m.custom.LocalRoot(ctx, team, rootfs)
	if err != nil {
		return "", fmt.Errorf("its template's root file system: %w", err)
	}
	return local, nil
}

// PoolStats reports what the pool keeps ready.
func (m *Manager) PoolStats() sandbox.PoolStats {
	st := m.pool.Stats()
	return sandbox.PoolStats{Ready: st.Ready, Shells: st.Shells, Standbys: st.Standbys}
}

// put writes a sandbox's record (a failpoint for tests).
func (m *Manager) put(ctx context.Context, rec *sandbox.Sandbox) error {
	if err := failpoint.Inject(failpoint.StorePut); err != nil {
		return err
	}
	return m.st.Put(ctx, rec)
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

// templateLimits returns the default limits of a built-in template.
func (m *Manager) templateLimits(name string) sandbox.Limits {
	if l, ok := m.cfg.TemplateLimits[name]; ok {
		return l
	}
	return m.cfg.DefaultLimits
}

// limits returns a sandbox's limits, filling from the defaults what a
// record of an older daemon lacks.
func (m *Manager) limits(rec *sandbox.Sandbox) sandbox.Limits {
	return m.cfg.DefaultLimits.Over(rec.Limits())
}

// handOff is what a box of rec gets: its policy, its identity and
// environment, its limits.
func (m *Manager) handOff(rec *sandbox.Sandbox) box.HandOff {
	return box.HandOff{Policy: rec.Network, Envs: sandboxEnvs(rec), Limits: m.limits(rec)}
}

// sandboxEnvs is what the agent of rec's box gets as environment
// variables at hand-off: E2B's identity variables (E2B_SANDBOX,
// E2B_SANDBOX_ID, E2B_TEMPLATE_ID, E2B_TEAM_ID; the agent also writes them
// to /run/e2b/.NAME), then the sandbox's own, which win. A box restored from
// another sandbox's state carries that sandbox's values until it gets
// these.
func sandboxEnvs(rec *sandbox.Sandbox) map[string]string {
	out := map[string]string{
		"E2B_SANDBOX":     "true",
		"E2B_SANDBOX_ID":  rec.ID,
		"E2B_TEMPLATE_ID": rec.TemplateID,
		"E2B_TEAM_ID":     cmp.Or(rec.Team, "cellfork"), // a single host is one team, as clientID
	}
	maps.Copy(out, rec.Envs)
	return out
}

// checkpoint writes a leave-running checkpoint of l's box to dir, as
// foreground work (no pool refill competes with it). Caller holds l.op.
func (m *Manager) checkpoint(ctx context.Context, l *Live, dir string) error {
	defer m.adm.Busy()()
	return m.boxes.Checkpoint(ctx, l.box, dir, true)
}

func (m *Manager) pausedDir(id string) string { return filepath.Join(m.cfg.DataDir, "paused", id) }

// forkDir holds the images of forks in progress (Config.ForkDir).
func (m *Manager) forkDir() string {
	if m.cfg.ForkDir != "" {
		return m.cfg.ForkDir
	}
	return filepath.Join(m.cfg.DataDir, "forks")
}
