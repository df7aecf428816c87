// Package manager owns every sandbox state transition: create, kill,
// timeouts, and reconciling with what really runs after a daemon restart.
// It knows nothing about HTTP; internal/api translates.
package manager

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// netPrefix names the network namespaces of sandboxes ("cf-<id>-r/-s").
const netPrefix = "cf-"

// Config is the manager's part of the daemon configuration.
type Config struct {
	DataDir        string
	DefaultLimits  sandbox.Limits
	MaxLimits      sandbox.Limits
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	MaxUploadBytes int64
}

// Manager owns the live sandboxes. Safe for concurrent use.
type Manager struct {
	cfg Config
	rt  sandbox.Runtime
	st  sandbox.Store
	tpl *template.Registry
	log *slog.Logger

	mu   sync.Mutex
	live map[string]*Live // guarded by mu
}

// Live is a sandbox this daemon runs. Its lifecycle operations are
// serialized by mu.
type Live struct {
	mu        sync.Mutex
	rec       *sandbox.Sandbox // guarded by mu
	timer     *time.Timer      // guarded by mu
	dead      bool             // guarded by mu: killed, must not be used
	lastCPU   time.Duration    // guarded by mu
	lastAt    time.Time        // guarded by mu
	net       *netns.Network
	transport *http.Transport
}

// New returns a Manager. Call Reconcile before serving.
func New(cfg Config, rt sandbox.Runtime, st sandbox.Store, tpl *template.Registry, log *slog.Logger) *Manager {
	return &Manager{cfg: cfg, rt: rt, st: st, tpl: tpl, log: log, live: map[string]*Live{}}
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

func (m *Manager) bundleDir(id string) string {
	return filepath.Join(m.cfg.DataDir, "sandboxes", id)
}

// newTransport returns an HTTP transport whose every connection goes to a
// port inside the sandbox ("sandbox:<port>" in the request URL).
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

// lookup returns the live sandbox or a NotFound error.
func (m *Manager) lookup(id string) (*Live, error) {
	m.mu.Lock()
	l := m.live[id]
	m.mu.Unlock()
	if l == nil {
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
	return &c
}

// Endpoint returns the transport to reach ports inside a running sandbox,
// with a copy of its record (for the proxy's access checks).
func (m *Manager) Endpoint(id string) (http.RoundTripper, *sandbox.Sandbox, error) {
	l, err := m.lookup(id)
	if err != nil {
		return nil, nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return nil, nil, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	return l.transport, cloneRecord(l.rec), nil
}

// Kill destroys a sandbox and everything it holds.
func (m *Manager) Kill(ctx context.Context, id string) error {
	l, err := m.lookup(id)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	l.dead = true
	if l.timer != nil {
		l.timer.Stop()
	}
	m.mu.Lock()
	delete(m.live, id)
	m.mu.Unlock()
	return m.teardown(context.WithoutCancel(ctx), l.rec, l.net, l.transport)
}

// teardown frees a sandbox's runtime, network, files and record. It keeps
// going past errors so that as much as possible is freed.
func (m *Manager) teardown(ctx context.Context, rec *sandbox.Sandbox, n *netns.Network, tr *http.Transport) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var errs []error
	if tr != nil {
		tr.CloseIdleConnections()
	}
	if err := m.rt.Destroy(ctx, rec.RuntimeID); err != nil {
		errs = append(errs, err)
	}
	if n != nil {
		errs = append(errs, n.Destroy())
	} else {
		errs = append(errs, netns.Remove(netPrefix+rec.ID))
	}
	errs = append(errs, os.RemoveAll(m.bundleDir(rec.ID)))
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
	l, err := m.lookup(id)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	old := l.rec.EndAt
	l.rec.EndAt = time.Now().UTC().Add(d)
	if err := m.st.Put(ctx, l.rec); err != nil {
		l.rec.EndAt = old
		return err
	}
	m.armTimer(l, id)
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
	due := !l.dead && !time.Now().Before(l.rec.EndAt)
	l.mu.Unlock()
	if !due { // extended meanwhile, or already gone
		return
	}
	m.log.Info("sandbox timed out", "sandbox.id", id)
	if err := m.Kill(context.Background(), id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		m.log.Error("killing timed-out sandbox", "sandbox.id", id, "err", err)
	}
}

// Close stops the timers. Sandboxes keep running; the next daemon adopts
// them.
func (m *Manager) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.live {
		l.mu.Lock()
		if l.timer != nil {
			l.timer.Stop()
		}
		l.transport.CloseIdleConnections()
		l.mu.Unlock()
	}
}

// discard is the progress writer for template builds triggered by a create.
var discard io.Writer = io.Discard
