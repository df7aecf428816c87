// Package gateway is `cellfork gateway`: a stateless front for a region of
// a cluster that serves the whole E2B API. It authenticates (API keys,
// cached; JWTs, verified locally) and applies teams' location policies
// at the edge, places creates (internal/placement, reserved in the
// cluster database), lists from the database, and routes everything else
// to the host a sandbox lives on — by its id, which says so, with no
// database read on a data-plane request (a small in-memory map holds the
// few sandboxes that moved). Requests for another region's sandboxes are
// forwarded once to a gateway of that region; creates fail over to
// another allowed region when theirs cannot take them.
//
// It keeps what it needs to route in memory, refreshed from the database
// (polling, and NOTIFY for rare changes), and in a cache file, so that it
// starts and routes while PostgreSQL is down.
package gateway

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/jackc/pgx/v5"

	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/ids"
	"github.com/cellfork/cellfork/internal/metrics"
	"github.com/cellfork/cellfork/internal/placement"
	"github.com/cellfork/cellfork/internal/telemetry"
)

// Config configures a gateway.
type Config struct {
	URL      string // the cluster database
	Region   string // the region this gateway serves
	StateDir string // where the cache file lives
	// JWTKeys verify bearer tokens (Ed25519 and ECDSA P-256 public keys).
	JWTKeys []crypto.PublicKey
	// KeyTTL is how long a looked-up API key is trusted before it is
	// looked up again (revocations also arrive by NOTIFY).
	KeyTTL time.Duration
	// DefaultMemoryMB is what placement counts for a create that does not
	// say (the hosts' default).
	DefaultMemoryMB int64
	Log             *slog.Logger
	// Metrics counts requests, routing and auth failures (nil: none);
	// Tracing makes a span of every request (nil: off).
	Metrics *metrics.Gateway
	Tracing *telemetry.Tracing
}

// Gateway serves a region. Safe for concurrent use.
type Gateway struct {
	cfg Config
	log *slog.Logger

	db      atomic.Pointer[clusterdb.DB]
	view    atomic.Pointer[view]
	moved   atomic.Pointer[map[string]int] // sandbox id -> host slot, for those away from home
	secrets atomic.Pointer[clusterdb.Secrets]
	tokens  atomic.Pointer[ids.Tokens]
	keys    keyCache
	toHosts *http.Transport
	proxy   *httputil.ReverseProxy // forward's, over toHosts
	direct  *hostClient            // forwardDirect's connections
	// noDirect sends every forward through the reverse proxy (tests
	// compare the two).
	noDirect bool

	movedMu sync.Mutex // serializes updates of moved (copy on write)
}

// view is what the gateway routes and places by: immutable, swapped whole.
type view struct {
	Region  clusterdb.Region            `json:"region"`
	Regions []clusterdb.Region          `json:"regions"`
	Hosts   []clusterdb.Host            `json:"hosts"`
	Teams   map[string]clusterdb.Team   `json:"teams"`
	Keys    map[string]cachedKey        `json:"keys"` // by hex hash: the cache file's copy
	table   *placement.Table            `json:"-"`
	byName  map[string]clusterdb.Region `json:"-"`
	byID    map[int]clusterdb.Region    `json:"-"`
	at      time.Time
}

func (v *view) index() {
	v.table = placement.NewTable(v.Hosts, time.Now())
	v.byName, v.byID = map[string]clusterdb.Region{}, map[int]clusterdb.Region{}
	for _, r := range v.Regions {
		v.byName[r.Name], v.byID[r.ID] = r, r
	}
	v.at = time.Now()
}

// New returns a gateway; Start connects it.
func New(cfg Config) *Gateway {
	if cfg.KeyTTL == 0 {
		cfg.KeyTTL = 5 * time.Second
	}
	if cfg.DefaultMemoryMB == 0 {
		cfg.DefaultMemoryMB = 1024
	}
	g := &Gateway{cfg: cfg, log: cfg.Log}
	g.direct = newHostClient(hostDialer())
	g.toHosts = &http.Transport{
		DialContext:         hostDialer().DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	g.proxy = g.newProxy()
	empty := map[string]int{}
	g.moved.Store(&empty)
	g.keys.ttl = cfg.KeyTTL
	cfg.Metrics.SetHosts(g.hostCounts)
	return g
}

// hostDialer dials hosts so that one that goes silent (lost power, cut
// off) fails a request within seconds, never hangs it: a 1 s connect
// timeout, keepalive probes on idle connections (5 s, then 1 s apart,
// 3 of them), and TCP_USER_TIMEOUT (data unacknowledged for 5 s ends the
// connection).
func hostDialer() *net.Dialer {
	return &net.Dialer{
		Timeout:         time.Second,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: time.Second, Count: 3},
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 5000)
			})
			return errors.Join(err, serr)
		},
	}
}

func (g *Gateway) cachePath() string { return filepath.Join(g.cfg.StateDir, "gateway-cache.json") }

// Start connects to the cluster database (or, if it does not answer,
// starts from the cache file) and keeps the gateway's view current until
// ctx ends.
func (g *Gateway) Start(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := g.connect(dctx)
	cancel()
	if err != nil {
		if cerr := g.loadCache(); cerr != nil {
			return fmt.Errorf("the cluster database does not answer (%w) and there is no cache to start from (%v)", err, cerr)
		}
		g.log.Warn("cluster database unavailable: routing from the cache; reconnecting", "err", err)
	}
	go g.refreshLoop(ctx)
	go g.listen(ctx)
	return nil
}

// connect opens the database and loads everything.
func (g *Gateway) connect(ctx context.Context) error {
	if g.db.Load() == nil {
		db, err := clusterdb.Open(ctx, g.cfg.URL)
		if err != nil {
			return err
		}
		g.db.Store(db)
	}
	db := g.db.Load()
	s, err := db.EnsureSecrets(ctx, ids.RandomKey)
	if err != nil {
		return err
	}
	g.setSecrets(s)
	if err := g.refreshView(ctx, true); err != nil {
		return err
	}
	return g.reloadMoved(ctx)
}

func (g *Gateway) setSecrets(s clusterdb.Secrets) {
	g.secrets.Store(&s)
	if t, err := ids.NewTokens(s.Tokens...); err == nil {
		g.tokens.Store(t)
	}
}

// refreshView reloads regions, teams and hosts (all of them when full,
// else those changed since the last load).
func (g *Gateway) refreshView(ctx context.Context, full bool) error {
	db := g.db.Load()
	if db == nil {
		return errors.New("not connected")
	}
	old := g.view.Load()
	v := &view{Keys: map[string]cachedKey{}}
	var err error
	if v.Regions, err = db.Regions(ctx); err != nil {
		return err
	}
	teams, err := db.Teams(ctx)
	if err != nil {
		return err
	}
	v.Teams = map[string]clusterdb.Team{}
	for _, t := range teams {
		v.Teams[t.ID] = t
	}
	found := false
	for _, r := range v.Regions {
		if r.Name == g.cfg.Region {
			v.Region, found = r, true
		}
	}
	if !found {
		return fmt.Errorf("region %q is not in the cluster (add it: cellfork admin region add)", g.cfg.Region)
	}
	if full || old == nil {
		v.Hosts, err = db.Hosts(ctx, time.Time{})
	} else {
		var changed []clusterdb.Host
		changed, err = db.Hosts(ctx, old.at.Add(-2*time.Second))
		v.Hosts = mergeHosts(old.Hosts, changed)
	}
	if err != nil {
		return err
	}
	v.index()
	g.view.Store(v)
	return nil
}

func mergeHosts(old, changed []clusterdb.Host) []clusterdb.Host {
	out := make([]clusterdb.Host, 0, len(old)+len(changed))
	seen := map[int]bool{}
	for _, h := range changed {
		seen[h.Slot] = true
		out = append(out, h)
	}
	for _, h := range old {
		if !seen[h.Slot] {
			out = append(out, h)
		}
	}
	return out
}

func (g *Gateway) reloadMoved(ctx context.Context) error {
	db := g.db.Load()
	if db == nil {
		return errors.New("not connected")
	}
	m, err := db.Moved(ctx)
	if err != nil {
		return err
	}
	g.movedMu.Lock()
	g.moved.Store(&m)
	g.movedMu.Unlock()
	return nil
}

// setMoved records that sandbox id lives on slot (home: not moved).
func (g *Gateway) setMoved(id string, slot int) {
	g.movedMu.Lock()
	defer g.movedMu.Unlock()
	old := *g.moved.Load()
	m := make(map[string]int, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if s, err := ids.ParseSandbox(id); err == nil && s.Slot == slot {
		delete(m, id)
	} else {
		m[id] = slot
	}
	g.moved.Store(&m)
}

// lostGrace is how long past its lease a host must stay silent while
// others heartbeat before it is declared lost: more than hosts' heartbeat
// interval (2 s), so that after a database outage every host is heard
// again first.
const lostGrace = 3 * time.Second

// refreshLoop polls hosts every second, everything every 30 s (and the
// moved map), sweeps lost hosts, writes the cache, and reconnects.
func (g *Gateway) refreshLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var n int
	var lastWarn time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n++
		var err error
		if g.db.Load() == nil || g.secrets.Load() == nil {
			err = g.connect(ctx)
		} else {
			err = g.refreshView(ctx, n%30 == 0)
			if err == nil && n%30 == 0 {
				err = g.reloadMoved(ctx)
			}
			if err == nil && n%2 == 0 {
				db := g.db.Load()
				if lost, serr := db.SweepLost(ctx, lostGrace); serr == nil && len(lost) > 0 {
					g.log.Warn("hosts declared lost", "slots", lost)
				}
				if n%30 == 0 {
					_, _ = db.ExpireCreating(ctx, 5*time.Minute)
				}
			}
		}
		if err != nil && time.Since(lastWarn) > time.Minute {
			g.log.Warn("cluster database unavailable; routing from what is known", "err", err)
			lastWarn = time.Now()
		}
		if err == nil && n%10 == 0 {
			g.saveCache()
		}
	}
}

// listen follows the database's notifications: a sandbox moved, a host
// changed state, keys or teams changed. Notifications sent while it was
// not listening are lost, so every reconnect reloads.
func (g *Gateway) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := g.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		g.log.Debug("notification listener reconnecting", "err", err)
		time.Sleep(time.Second)
	}
}

func (g *Gateway) listenOnce(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	conn, err := pgx.Connect(cctx, g.cfg.URL)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, ch := range []string{"cellfork_moved", "cellfork_hosts", "cellfork_keys"} {
		if _, err := conn.Exec(ctx, "LISTEN "+ch); err != nil {
			return err
		}
	}
	// What happened while it was not listening.
	if g.db.Load() != nil {
		_ = g.refreshView(ctx, true)
		_ = g.reloadMoved(ctx)
		g.keys.flush()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		switch n.Channel {
		case "cellfork_moved":
			var id string
			var slot int
			if _, err := fmt.Sscanf(n.Payload, "%20s:%d", &id, &slot); err == nil {
				g.setMoved(id, slot)
			}
		case "cellfork_hosts":
			_ = g.refreshView(ctx, false)
		case "cellfork_keys":
			g.keys.flush()
			_ = g.refreshView(ctx, false)
		}
	}
}

// cache is what the cache file holds.
type cache struct {
	View    *view              `json:"view"`
	Moved   map[string]int     `json:"moved"`
	Secrets *clusterdb.Secrets `json:"secrets"`
}

func (g *Gateway) saveCache() {
	if g.cfg.StateDir == "" {
		return
	}
	v := *g.view.Load()
	v.Keys = g.keys.export()
	b, err := json.Marshal(cache{View: &v, Moved: *g.moved.Load(), Secrets: g.secrets.Load()})
	if err != nil {
		return
	}
	tmp := g.cachePath() + ".tmp"
	if os.WriteFile(tmp, b, 0o600) == nil {
		_ = os.Rename(tmp, g.cachePath())
	}
}

func (g *Gateway) loadCache() error {
	if g.cfg.StateDir == "" {
		return errors.New("no state directory")
	}
	b, err := os.ReadFile(g.cachePath())
	if err != nil {
		return err
	}
	var c cache
	if err := json.Unmarshal(b, &c); err != nil || c.View == nil || c.Secrets == nil {
		return fmt.Errorf("reading %s: bad cache", g.cachePath())
	}
	c.View.index()
	g.view.Store(c.View)
	if c.Moved == nil {
		c.Moved = map[string]int{}
	}
	g.moved.Store(&c.Moved)
	g.setSecrets(*c.Secrets)
	g.keys.load(c.View.Keys)
	return nil
}

// Close closes the database.
func (g *Gateway) Close() {
	if db := g.db.Load(); db != nil {
		db.Close()
	}
	g.toHosts.CloseIdleConnections()
	g.direct.closeIdle(true)
}
