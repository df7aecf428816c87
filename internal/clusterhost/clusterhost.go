// Package clusterhost makes a host part of a cluster (`cellfork serve
// --cluster`): it registers the host (a slot that is never reused),
// heartbeats its lease and capacity, mints ids that say where its
// sandboxes live, takes calls only from the cluster's gateways, and keeps
// its sandboxes' and snapshots' rows in the cluster database current.
//
// PostgreSQL may go away: the host keeps running its sandboxes and serving
// them. Its local store is the journal: every change is written there
// first and marked for sync; syncs retry until the database answers, and
// a start (or a re-registration after the host was declared lost) syncs
// everything again. A row that another host took over (ErrStale) means
// the sandbox moved on: the host drops its copy.
package clusterhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/clusterauth"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/ids"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Config is a host's cluster settings.
type Config struct {
	URL       string // the cluster database
	Region    string // the region's name
	Advertise string // host:port gateways reach this host at
	DataDir   string
	Runtime   string // the runtime's build: a snapshot's image restores only on a host of its build
	// Heartbeat is how often the lease is renewed; the lease lasts TTL.
	Heartbeat time.Duration
	TTL       time.Duration
}

// state is what the host remembers of its membership, in its data dir, so
// it starts (and serves its sandboxes) while the database is down.
type state struct {
	Name     string   `json:"name"`
	Slot     int      `json:"slot"`
	Region   int      `json:"region"`
	Epoch    int64    `json:"epoch"`
	Internal []byte   `json:"internal"` // gateway signing key
	Tokens   [][]byte `json:"tokens"`   // token keys, newest first
}

// Member is the host's membership. Safe for concurrent use.
type Member struct {
	cfg    Config
	log    *slog.Logger
	db     *clusterdb.DB // nil until the database answers
	tokens *ids.Tokens

	mu    sync.Mutex
	st    state
	dirty map[string]bool // sandbox ids to sync; guarded by mu
	snaps map[string]bool // snapshot ids to sync; guarded by mu
	kick  chan struct{}

	// syncing serializes row writes (syncSandbox, syncSnapshot; held by
	// the one that writes, a semaphore a waiter can give up on): each reads
	// the local record and writes its row, so two at once for one id (the
	// sync loop's and an operation's) could write the older read last, a
	// row losing the image root it had just gained.
	syncing chan struct{}

	local sandbox.Store // the host's own store (the journal)
	host  Host          // set by Start
	// healthy: the last sync reached the database, so changes are synced
	// before the operation answers (a list right after a create shows
	// it); otherwise they wait for the sync loop and nothing waits for
	// the database.
	healthy atomic.Bool
	// recheck: every row was marked (the host (re)joined); once they are
	// written, the host's store roots are checked (Host.RecheckRoots).
	recheck atomic.Bool
	pruned  time.Time // the heartbeat loop's last try at pruning tombstones
}

// Host is what the member needs of the host's daemon.
type Host interface {
	Usage() (sandboxes int, memoryMB int64, starting int)
	PoolStats() sandbox.PoolStats
	// Drop kills a sandbox this host must no longer run (it moved on, or
	// its team is over its limit).
	Drop(ctx context.Context, id, why string)
	// Published says that the sandbox's row names its paused image's
	// root in the chunk store, which the cluster's collection keeps from
	// then on: the host may drop the disk's copy (manager.Published).
	Published(ctx context.Context, id, root string)
	// RecheckRoots uploads again what the chunk store lost of the host's
	// images while it was away (manager.RecheckRoots): called once the
	// rows are written after the host (re)joined.
	RecheckRoots(ctx context.Context)
}

func statePath(dir string) string { return filepath.Join(dir, "cluster.json") }

// Join joins the cluster: the database is asked to register the host (and
// for the cluster's keys); if it does not answer, the membership the host
// last had is used (a host that never joined must reach the database).
func Join(ctx context.Context, cfg Config, log *slog.Logger) (*Member, error) {
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 2 * time.Second
	}
	if cfg.TTL == 0 {
		cfg.TTL = 6 * time.Second
	}
	m := &Member{cfg: cfg, log: log, dirty: map[string]bool{}, snaps: map[string]bool{}, kick: make(chan struct{}, 1),
		syncing: make(chan struct{}, 1)}
	saved, haveSaved := loadState(cfg.DataDir)
	m.st = saved
	if m.st.Name == "" {
		m.st.Name = "host-" + sandbox.RandomHex(8)
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err := m.register(dctx)
	cancel()
	if err != nil {
		if !haveSaved {
			return nil, fmt.Errorf("joining the cluster (it must answer the first time): %w", err)
		}
		log.Warn("cluster database unavailable: running as the host it last was; will register when it answers", "slot", saved.Slot, "err", err)
		m.st = saved
	}
	if m.tokens, err = ids.NewTokens(m.st.Tokens...); err != nil {
		return nil, err
	}
	return m, nil
}

func loadState(dir string) (state, bool) {
	var s state
	b, err := os.ReadFile(statePath(dir))
	if err != nil || json.Unmarshal(b, &s) != nil || s.Slot == 0 {
		return s, false
	}
	return s, true
}

func (m *Member) saveState() error {
	m.mu.Lock()
	b, _ := json.MarshalIndent(m.st, "", "  ")
	m.mu.Unlock()
	tmp := statePath(m.cfg.DataDir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, statePath(m.cfg.DataDir))
}

// register opens the database (if not yet), registers the host and stores
// its membership.
func (m *Member) register(ctx context.Context) error {
	if m.db == nil {
		db, err := clusterdb.Open(ctx, m.cfg.URL)
		if err != nil {
			return err
		}
		m.db = db
	}
	secrets, err := m.db.EnsureSecrets(ctx, ids.RandomKey)
	if err != nil {
		return err
	}
	regions, err := m.db.Regions(ctx)
	if err != nil {
		return err
	}
	region := -1
	for _, r := range regions {
		if r.Name == m.cfg.Region {
			region = r.ID
		}
	}
	if region < 0 {
		return fmt.Errorf("region %q is not in the cluster (add it: cellfork admin region add)", m.cfg.Region)
	}
	slot, epoch, err := m.db.Register(ctx, m.st.Name, region, m.cfg.Advertise)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.st.Slot, m.st.Region, m.st.Epoch = slot, region, epoch
	m.st.Internal, m.st.Tokens = secrets.Internal, secrets.Tokens
	m.mu.Unlock()
	if m.tokens != nil {
		if t, err := ids.NewTokens(secrets.Tokens...); err == nil {
			m.tokens = t
		}
	}
	m.log.Info("joined the cluster", "host", m.st.Name, "slot", slot, "region", m.cfg.Region, "epoch", epoch)
	return m.saveState()
}

// Slot is the host's slot.
func (m *Member) Slot() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Slot
}

// IDs mints the host's sandbox and snapshot ids and their tokens.
func (m *Member) IDs() sandbox.IDs { return memberIDs{m} }

type memberIDs struct{ m *Member }

func (i memberIDs) SandboxID() string {
	i.m.mu.Lock()
	defer i.m.mu.Unlock()
	return ids.NewSandbox(i.m.st.Region, i.m.st.Slot)
}

func (i memberIDs) SnapshotID() string {
	i.m.mu.Lock()
	defer i.m.mu.Unlock()
	return ids.NewSnapshot(i.m.st.Region)
}

func (i memberIDs) Token(id string) string { return i.m.tokens.Token(id) }

func (i memberIDs) Own(id string) bool {
	s, err := ids.ParseSandbox(id)
	i.m.mu.Lock()
	defer i.m.mu.Unlock()
	return err == nil && s.Region == i.m.st.Region && s.Slot == i.m.st.Slot
}

// InternalKey returns the cluster's internal key: a host signs its calls
// to another host's image endpoints with it (clusterauth.SignPeer), and
// checks theirs.
func (m *Member) InternalKey() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Internal
}

// Auth takes calls only from the cluster's gateways.
func (m *Member) Auth() api.Authenticator { return gatewayAuth{m} }

type gatewayAuth struct{ m *Member }

func (a gatewayAuth) verify(r *http.Request) (clusterauth.Caller, error) {
	a.m.mu.Lock()
	key := a.m.st.Internal
	a.m.mu.Unlock()
	return clusterauth.Verify(r, [][]byte{key}, time.Now())
}

func (a gatewayAuth) Control(r *http.Request) (context.Context, string) {
	c, err := a.verify(r)
	if err != nil {
		return nil, err.Error()
	}
	ctx := sandbox.WithTeam(r.Context(), c.Team)
	if c.Mint != "" {
		ctx = api.WithMint(ctx, c.Mint)
	}
	return ctx, ""
}

func (a gatewayAuth) DataPlane(r *http.Request) string {
	if _, err := a.verify(r); err != nil {
		return err.Error()
	}
	return ""
}

// Store wraps the host's local store: every change is written there, then
// synced to the cluster database.
func (m *Member) Store(local sandbox.Store) sandbox.Store {
	m.local = local
	return syncStore{local, m}
}

type syncStore struct {
	sandbox.Store
	m *Member
}

// Put writes the record, then its row; a row that says this host must
// drop the sandbox (it moved on meanwhile, or its team is over its limit)
// fails the write's operation, which undoes its step (the drop follows).
func (s syncStore) Put(ctx context.Context, sb *sandbox.Sandbox) error {
	if err := s.Store.Put(ctx, sb); err != nil {
		return err
	}
	return s.m.syncNow(ctx, s.m.dirty, sb.ID, s.m.syncSandbox)
}

func (s syncStore) Delete(ctx context.Context, id string) error {
	if err := s.Store.Delete(ctx, id); err != nil {
		return err
	}
	return s.m.syncNow(ctx, s.m.dirty, id, s.m.syncSandbox)
}

// syncNow syncs a row (a sandbox's, or a snapshot's: set and sync say
// which) before its operation answers, if the database is healthy (briefly
// bounded), else leaves it to the sync loop. A create from it, through any
// gateway, may follow at once. Its error is a row write's dropped alone:
// a database that fails only defers the row.
func (m *Member) syncNow(ctx context.Context, set map[string]bool, id string, sync func(context.Context, string) error) error {
	if m.db == nil || m.host == nil || !m.healthy.Load() {
		m.mark(set, id)
		return nil
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 500*time.Millisecond)
	defer cancel()
	if err := sync(sctx, id); err != nil {
		if errors.As(err, new(dropped)) {
			return err
		}
		m.healthy.Store(false)
		m.mark(set, id)
	}
	return nil
}

func (s syncStore) PutSnapshot(ctx context.Context, sn *sandbox.Snapshot) error {
	if err := s.Store.PutSnapshot(ctx, sn); err != nil {
		return err
	}
	return s.m.syncNow(ctx, s.m.snaps, sn.ID, s.m.syncSnapshot)
}

func (s syncStore) DeleteSnapshot(ctx context.Context, id string) error {
	if err := s.Store.DeleteSnapshot(ctx, id); err != nil {
		return err
	}
	return s.m.syncNow(ctx, s.m.snaps, id, s.m.syncSnapshot)
}

func (m *Member) mark(set map[string]bool, id string) {
	m.mu.Lock()
	set[id] = true
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Start runs the heartbeat and the sync until ctx ends.
func (m *Member) Start(ctx context.Context, host Host) {
	m.host = host
	m.markAll(ctx)
	go m.heartbeatLoop(ctx)
	go m.syncLoop(ctx)
	go m.listenLoop(ctx)
}

// markAll marks every local sandbox and snapshot for sync, and the rows
// of this host the local store does not have (gone while the database was
// away, or never created).
func (m *Member) markAll(ctx context.Context) {
	m.recheck.Store(true)
	recs, _ := m.local.List(ctx)
	for _, r := range recs {
		m.mark(m.dirty, r.ID)
	}
	snaps, _ := m.local.ListSnapshots(ctx)
	for _, s := range snaps {
		m.mark(m.snaps, s.ID)
	}
	if m.db == nil {
		return
	}
	rows, err := m.db.HostSandboxes(ctx, m.Slot())
	if err != nil {
		return
	}
	for _, r := range rows {
		// A row still "creating" may be a create on its way here.
		if r.State != "creating" || time.Since(r.StartedAt) > 2*time.Minute {
			m.mark(m.dirty, r.ID)
		}
	}
}

// Close stops nothing the sandboxes need; it closes the database.
func (m *Member) Close() {
	if m.db != nil {
		m.db.Close()
	}
}

var errNoDB = errors.New("not connected to the cluster database")
