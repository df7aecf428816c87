// Package daemon wires the parts of `cellfork serve` together: it validates
// the configuration, takes the data directory's lock, opens the store,
// builds templates, reconciles with running sandboxes and serves HTTP.
package daemon

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/clusterhost"
	"github.com/cellfork/cellfork/internal/manager"
	"github.com/cellfork/cellfork/internal/metrics"
	"github.com/cellfork/cellfork/internal/netns"
	"github.com/cellfork/cellfork/internal/runtime/gvisor"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/snapshots"
	"github.com/cellfork/cellfork/internal/store"
	"github.com/cellfork/cellfork/internal/telemetry"
	"github.com/cellfork/cellfork/internal/template"
	"github.com/cellfork/cellfork/internal/templates"
)

// Config is the whole daemon configuration; flags and environment variables
// map onto it in cmd/cellfork, and docs/configuration.md describes it.
type Config struct {
	// The manager's part: limits, timeouts, pool, admission, snapshots.
	// Its TemplateLimits and AgentPath are worked out by Run.
	manager.Config
	Addr        string
	TemplateDir string // default <DataDir>/templates
	Runsc       string
	AgentDir    string
	Domain      string
	APIKeys     []string // empty: use (or create) <data>/api-key
	// TemplateOverrides are the operator's per-template limits (zero
	// fields unset), over the template's own (templates/<name>/limits).
	TemplateOverrides map[string]sandbox.Limits
	// DNS are the upstream resolvers answering the sandboxes' resolvers;
	// empty means the host's /etc/resolv.conf.
	DNS []string
	// Cluster, with a URL, makes the daemon a host of a cluster.
	Cluster clusterhost.Config
	// MetricsAddr also serves GET /metrics, without a key, on this address
	// ("" = only on Addr, behind the key). Tracing turns on OpenTelemetry
	// tracing (OTEL_* variables configure it).
	MetricsAddr string
	Tracing     bool
	// UpstreamCA is a PEM file of root certificates the egress proxy
	// trusts, besides the host's, for hosts with network rules ("": none).
	UpstreamCA string
	// Build configures custom template builds (templates.go).
	Build BuildConfig
	// Store is the chunk store snapshot images are uploaded to (images.go).
	Store StoreConfig
}

// Validate rejects configurations that cannot work.
func (c *Config) Validate() error {
	var errs []error
	if !filepath.IsAbs(c.DataDir) {
		errs = append(errs, fmt.Errorf("--data-dir must be an absolute path, got %q", c.DataDir))
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("--addr %q: %w", c.Addr, err))
	}
	if _, _, err := net.SplitHostPort(c.MetricsAddr); c.MetricsAddr != "" && err != nil {
		errs = append(errs, fmt.Errorf("--metrics-addr %q: %w", c.MetricsAddr, err))
	}
	if c.MaxUploadBytes <= 0 {
		errs = append(errs, errors.New("--max-upload-mb must be positive"))
	}
	errs = append(errs, c.validateLimits()...)
	if c.Cluster.URL != "" && c.Cluster.Region == "" {
		errs = append(errs, errors.New("--cluster needs --region (the region this host is in)"))
	}
	errs = append(errs, c.Build.validate()...)
	errs = append(errs, c.Store.validate()...)
	if c.StoreGCInterval < 0 || c.StoreGCGrace < 0 {
		errs = append(errs, errors.New("--store-gc-interval and --store-gc-grace must not be negative"))
	}
	if c.DefaultTimeout <= 0 || c.DefaultTimeout > c.MaxTimeout {
		errs = append(errs, errors.New("--default-timeout must be positive and at most --max-timeout"))
	}
	for _, f := range []struct {
		name string
		v    int64
		min  int64
	}{
		{"--pool-ready", int64(c.PoolReady), 0}, {"--pool-shells", int64(c.PoolShells), 0},
		{"--standby-snapshots", int64(c.StandbySnapshots), 0},
		{"--start-concurrency", int64(c.StartConcurrency), 1}, {"--start-queue", int64(c.StartQueue), 1},
		{"--max-fork", int64(c.MaxFork), 1}, {"--snapshot-cap-mb", c.SnapshotCapBytes, 0},
		{"--start-wait", int64(c.StartWait), 1}, {"--spill-after", int64(c.SpillAfter), 0},
	} {
		if f.v < f.min {
			errs = append(errs, fmt.Errorf("%s must be at least %d", f.name, f.min))
		}
	}
	for _, s := range c.DNS {
		if _, err := netip.ParseAddrPort(s); err != nil {
			errs = append(errs, fmt.Errorf("--dns %q: want an IP address and port, like 1.1.1.1:53", s))
		}
	}
	return errors.Join(errs...)
}

// Run serves until ctx is cancelled. Sandboxes keep running after it
// returns; the next Run adopts them.
func Run(ctx context.Context, cfg Config, log *slog.Logger, out io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("cellfork serve must run as root (it creates network namespaces and gVisor sandboxes)")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return err
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	clustered := cfg.Cluster.URL != ""
	if len(cfg.APIKeys) == 0 && !clustered {
		key, created, err := loadOrCreateKey(filepath.Join(cfg.DataDir, "api-key"))
		if err != nil {
			return err
		}
		if created {
			fmt.Fprintf(out, "cellfork: generated API key %s (stored in %s)\n", key, filepath.Join(cfg.DataDir, "api-key"))
		}
		cfg.APIKeys = []string{key}
	}
	if len(cfg.DNS) == 0 {
		if cfg.DNS, err = netns.UpstreamDNS("/etc/resolv.conf"); err != nil || len(cfg.DNS) == 0 {
			log.Warn("no upstream resolver in /etc/resolv.conf; names will not resolve inside sandboxes (set --dns)", "err", err)
		}
	}
	st, err := store.Open(filepath.Join(cfg.DataDir, "state.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	if cfg.TemplateLimits, err = cfg.templateLimits(); err != nil {
		return err
	}
	grt, err := gvisor.New(gvisor.Config{Runsc: cfg.Runsc, Root: filepath.Join(cfg.DataDir, "runsc")})
	if err != nil {
		return err
	}
	tracing, err := telemetry.New(ctx, telemetry.Config{Enabled: cfg.Tracing, Version: version()})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tracing.Shutdown(sctx) // exports what is buffered
	}()
	src := &hostSource{dataDir: cfg.DataDir}
	mh := metrics.NewHost(metrics.Config{Source: src, Version: version(), TemplateLabel: templateLabel})
	rt := mh.Runtime(grt, imageKind)
	if cfg.TemplateDir == "" {
		cfg.TemplateDir = filepath.Join(cfg.DataDir, "templates")
	}
	tpl := template.NewRegistry(cfg.TemplateDir, cfg.AgentDir)
	if !clustered { // a cluster host's comes from the cluster (below)
		if _, err := tpl.Rootfs(ctx, "base", out); err != nil {
			return err
		}
	}
	if cfg.AgentPath, err = tpl.AgentPath(); err != nil {
		return err
	}
	// The host's side of sandbox egress, before any network is made.
	hostNets, err := netns.HostNetworks()
	if err != nil {
		return err
	}
	if err := netns.SetupHost(hostNets); err != nil {
		return err
	}
	// The CA of network rules' TLS, the daemon's for good (sandboxes and
	// snapshots trust it).
	ca, err := netns.LoadCA(filepath.Join(cfg.DataDir, "egress-ca.pem"))
	if err != nil {
		return err
	}
	cfg.EgressCA = ca.CertPEM()
	roots, err := upstreamRoots(cfg.UpstreamCA)
	if err != nil {
		return err
	}
	images, where, err := openImages(ctx, cfg.Store, cfg.DataDir, log)
	if err != nil {
		return err
	}
	if images != nil {
		log.Info("snapshot images are uploaded to the chunk store", "store", where)
	}
	deps := manager.Deps{
		Runtime: rt, Store: st, Templates: tpl, Log: log, Agent: box.HTTPAgent{}, Images: images,
		Networks: netns.NewHost(netns.Config{HostBlocked: hostNets, DNS: cfg.DNS, CA: ca, UpstreamRoots: roots}),
	}
	apiCfg := api.Config{APIKeys: cfg.APIKeys, Domain: cfg.Domain, MaxUploadBytes: cfg.MaxUploadBytes}
	var member *clusterhost.Member
	// What an image needs of a host to restore there: the runsc build and,
	// in a cluster, the built-in template's artifact (its root file system
	// is the same bytes at the same path on every host that has it).
	runtimeID := grt.Build()
	if clustered {
		// The template first: a host joins (and heartbeats) once it can
		// take sandboxes, not while it pulls 2 GB.
		if err := clusterTemplate(ctx, cfg, tpl, images, out); err != nil {
			return err
		}
		if a := tpl.Artifact("base"); a != "" {
			runtimeID += "+base." + a[:16]
		}
		cfg.Cluster.DataDir, cfg.Cluster.Runtime = cfg.DataDir, runtimeID
		if cfg.Cluster.Advertise == "" {
			cfg.Cluster.Advertise = cfg.Addr
		}
		if member, err = clusterhost.Join(ctx, cfg.Cluster, log); err != nil {
			return err
		}
		defer member.Close()
		deps.Store, deps.IDs, apiCfg.Auth = member.Store(st), member.IDs(), member.Auth()
		if images != nil {
			deps.Cluster = member // the hosts' snapshots come through the store
		}
		fmt.Fprintf(out, "cellfork: host slot %d of the cluster, region %s\n", member.Slot(), cfg.Cluster.Region)
	}
	cfg.RuntimeBuild, cfg.ForkDir = runtimeID, forkDir(cfg.DataDir)
	m := manager.New(cfg.Config, deps)
	src.m = m
	if err := m.Reconcile(ctx); err != nil {
		log.Warn("reconcile incomplete", "err", err)
	}
	if err := m.Start(ctx); err != nil {
		return fmt.Errorf("starting: %w", err)
	}
	defer m.Close()
	var svc *templates.Service
	var shared templates.Shared
	if member != nil && images != nil {
		// A cluster's templates travel through the chunk store.
		tmp := filepath.Join(cfg.DataDir, "tmp")
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			return err
		}
		shared = sharedTemplates{member: member, images: images, tmp: tmp}
	}
	if !clustered || shared != nil {
		if svc, err = openTemplates(cfg, m, tpl, shared, log); err != nil {
			return err
		}
		svc.Start()
		defer svc.Close() // before the manager closes: builds use its sandboxes
		apiCfg.Templates, apiCfg.BuiltinLimits = svc, cfg.TemplateLimits
	}
	if member != nil {
		mctx, cancel := context.WithCancel(ctx)
		defer cancel()
		member.Start(mctx, hostView{m})
	}
	go mh.SampleEgress(ctx, egressInterval, egressReader(m))
	if cfg.MetricsAddr != "" {
		addr, err := serveMetrics(ctx, cfg.MetricsAddr, mh.Handler(), log)
		if err != nil {
			return fmt.Errorf("listening on --metrics-addr %s: %w", cfg.MetricsAddr, err)
		}
		fmt.Fprintf(out, "cellfork: metrics on http://%s/metrics\n", addr)
	}
	if tracing != nil {
		fmt.Fprintln(out, "cellfork: tracing on (OTLP over HTTP; OTEL_EXPORTER_OTLP_ENDPOINT says where)")
	}
	apiCfg.Metrics, apiCfg.Host, apiCfg.Tracing = mh, src, tracing
	var h http.Handler = api.New(apiCfg, m, log)
	if ci, ok := images.(chunkImages); ok && member != nil {
		// The cluster's hosts fetch images from each other (peer.go).
		ci.peers.set(member.InternalKey)
		h = (&peerServer{s: ci.s, snaps: m, key: member.InternalKey, log: log}).handler(h)
	}
	return serve(ctx, cfg.Addr, h, log, out)
}

// clusterTemplate resolves a cluster host's built-in template: with a
// shared chunk store, the cluster's artifact (published by this host if it
// is the first), else the host's own build. The database is asked over a
// connection of its own: an unreachable one leaves the artifact this host
// pulled before (template.Registry.Share).
func clusterTemplate(ctx context.Context, cfg Config, tpl *template.Registry, images snapshots.ImageStore, out io.Writer) error {
	if images != nil {
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		db, err := clusterdb.Open(dctx, cfg.Cluster.URL)
		cancel()
		if err == nil {
			defer db.Close()
		}
		tmp := filepath.Join(cfg.DataDir, "tmp")
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			return err
		}
		tpl.Share(builtinArtifacts{db: db, dbErr: err, layers: sharedTemplates{images: images, tmp: tmp}})
	}
	_, err := tpl.Rootfs(ctx, "base", out)
	return err
}

// hostView is what a cluster member needs of the manager.
type hostView struct{ m *manager.Manager }

func (h hostView) Usage() (int, int64, int) {
	u := h.m.Usage()
	return u.Sandboxes, u.MemoryMB, u.Starting
}

func (h hostView) PoolStats() sandbox.PoolStats { return h.m.PoolStats() }

func (h hostView) Drop(ctx context.Context, id, why string) { h.m.Drop(ctx, id, why) }

func (h hostView) Published(ctx context.Context, id, root string) { h.m.Published(ctx, id, root) }

func (h hostView) RecheckRoots(ctx context.Context) { h.m.RecheckRoots(ctx) }

// upstreamRoots returns the host's roots plus those in the PEM file (nil
// for the host's alone).
func upstreamRoots(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pemData, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--upstream-ca: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("--upstream-ca %s: no PEM certificate in it", file)
	}
	return pool, nil
}

func serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger, out io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second, // slow clients cannot hold a connection forever
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	fmt.Fprintf(out, "cellfork: listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// lockDataDir takes an exclusive lock so two daemons never share a data dir.
func lockDataDir(dir string) (func(), error) {
	path := filepath.Join(dir, "daemon.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("another cellfork daemon (pid %s) is using data directory %s", strings.TrimSpace(string(pid)), dir)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("%d\n", os.Getpid())), 0)
	return func() { f.Close() }, nil
}

func loadOrCreateKey(path string) (key string, created bool, err error) {
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), false, nil
	}
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	key = "cf_" + hex.EncodeToString(b)
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", false, fmt.Errorf("storing API key: %w", err)
	}
	return key, true, nil
}

// forkDir is where fork's images go: in memory (/dev/shm, a tmpfs) when
// the host has it, named after the data directory so that daemons on
// other data directories never share it; else beside the data.
func forkDir(dataDir string) string {
	var fs unix.Statfs_t
	if unix.Statfs("/dev/shm", &fs) != nil || fs.Type != unix.TMPFS_MAGIC {
		return filepath.Join(dataDir, "forks")
	}
	sum := sha256.Sum256([]byte(dataDir))
	return filepath.Join("/dev/shm", "cellfork-"+hex.EncodeToString(sum[:3]), "forks")
}
