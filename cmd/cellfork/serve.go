package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/daemon"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// defaultAgentDir is bin/ beside this executable, where `make build` puts
// the agent.
func defaultAgentDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "bin"
	}
	return filepath.Dir(exe)
}

func serve(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg := daemon.Config{}
	fs.StringVar(&cfg.Addr, "addr", envOr("CELLFORK_ADDR", "127.0.0.1:3000"), "listen address (env CELLFORK_ADDR)")
	fs.StringVar(&cfg.DataDir, "data-dir", envOr("CELLFORK_DATA_DIR", "/var/lib/cellfork"), "data directory (env CELLFORK_DATA_DIR)")
	fs.StringVar(&cfg.TemplateDir, "template-dir", os.Getenv("CELLFORK_TEMPLATE_DIR"), "template cache (default DATA_DIR/templates; env CELLFORK_TEMPLATE_DIR)")
	fs.StringVar(&cfg.Runsc, "runsc", envOr("CELLFORK_RUNSC", "/usr/local/lib/cellfork/runsc"), "static runsc binary (env CELLFORK_RUNSC)")
	fs.StringVar(&cfg.AgentDir, "agent-dir", defaultAgentDir(), "directory with cellfork-agent and its kernels (kernel.py...)")
	fs.StringVar(&cfg.Domain, "domain", os.Getenv("CELLFORK_DOMAIN"), "sandbox domain reported to SDKs for {port}-{id}.{domain} hosts (env CELLFORK_DOMAIN)")
	uploadMB := fs.Int64("max-upload-mb", 1024, "largest file upload accepted, in MiB")
	fs.IntVar(&cfg.DefaultLimits.CPUCount, "default-cpus", 1, "CPUs per sandbox unless its template or create says otherwise")
	fs.IntVar(&cfg.DefaultLimits.MemoryMB, "default-memory-mb", 1024, "memory per sandbox (MiB) unless its template or create says otherwise")
	fs.IntVar(&cfg.DefaultLimits.PidsMax, "pids-max", 512, "processes per user inside a sandbox (a fork bomb stops there) unless its template or create says otherwise")
	fs.IntVar(&cfg.DefaultLimits.OpenFiles, "open-files", 65536, "open files per process inside a sandbox unless its template or create says otherwise")
	fs.IntVar(&cfg.DefaultLimits.DiskMB, "disk-mb", 512, "writable root filesystem (/tmp included; /dev/shm gets half as much) per sandbox, in MiB, unless its template or create says otherwise; kept in sandbox memory; past it writes fail with ENOSPC")
	fs.IntVar(&cfg.MaxLimits.CPUCount, "max-cpus", runtime.NumCPU(), "most CPUs a create may ask for")
	fs.IntVar(&cfg.MaxLimits.MemoryMB, "max-memory-mb", 8192, "most memory (MiB) a create may ask for")
	fs.IntVar(&cfg.MaxLimits.DiskMB, "max-disk-mb", 4096, "largest disk (MiB) a create may ask for")
	fs.IntVar(&cfg.MaxLimits.PidsMax, "max-pids", 4096, "most processes per user a create may ask for")
	fs.IntVar(&cfg.MaxLimits.OpenFiles, "max-open-files", 1<<20, "most open files per process a create may ask for")
	cfg.TemplateOverrides = map[string]sandbox.Limits{}
	fs.Func("template-limits", "a template's defaults, as TEMPLATE:name=value,... with the create body's names (repeatable)", func(v string) error {
		name, l, err := template.ParseLimitsFlag(v)
		if err != nil {
			return err
		}
		cfg.TemplateOverrides[name] = cfg.TemplateOverrides[name].Over(l)
		return nil
	})
	fs.DurationVar(&cfg.DefaultTimeout, "default-timeout", 5*time.Minute, "sandbox lifetime unless the create asks otherwise")
	fs.DurationVar(&cfg.MaxTimeout, "max-timeout", 24*time.Hour, "longest sandbox lifetime a caller may set")
	fs.IntVar(&cfg.PoolReady, "pool-ready", 10, "sandboxes per template kept restored and ready to hand out (0 = none)")
	fs.IntVar(&cfg.PoolShells, "pool-shells", 2, "prepared sandboxes kept to restore snapshots, forks and rollbacks into (a fork of n children restores up to n into them)")
	fs.IntVar(&cfg.StandbySnapshots, "standby-snapshots", 2, "snapshots used last (created from, rolled back to) that keep a frozen sandbox restored from them, for the next use (0 = none)")
	fs.IntVar(&cfg.StartConcurrency, "start-concurrency", 2*runtime.NumCPU(), "sandbox starts (boots, restores) run at once; more wait in line")
	fs.IntVar(&cfg.StartQueue, "start-queue", 256, "starts that may wait in line before requests get 503")
	fs.DurationVar(&cfg.StartWait, "start-wait", time.Minute, "longest a start waits in line before a 503")
	capMB := fs.Int64("snapshot-cap-mb", 20480, "refuse new snapshots once snapshot images use this much disk (MiB; 0 = no cap)")
	fs.IntVar(&cfg.MaxFork, "max-fork", 64, "largest fork count")
	fs.DurationVar(&cfg.SpillAfter, "spill-after", 10*time.Second, "how long a paused sandbox stays frozen in memory before it is written to disk")
	dns := fs.String("dns", os.Getenv("CELLFORK_DNS"), "upstream resolvers (host:port, comma-separated) that answer the sandboxes' DNS (default: the host's /etc/resolv.conf; env CELLFORK_DNS)")
	fs.StringVar(&cfg.Cluster.URL, "cluster", os.Getenv("CELLFORK_CLUSTER"), "join the cluster whose PostgreSQL database this URL names (env CELLFORK_CLUSTER); without it the daemon is a single host")
	fs.StringVar(&cfg.Cluster.Region, "region", envOr("CELLFORK_REGION", ""), "with --cluster: the region this host is in (its name in the cluster's region table)")
	fs.StringVar(&cfg.Cluster.Advertise, "advertise", os.Getenv("CELLFORK_ADVERTISE"), "with --cluster: the host:port gateways reach this host at (default --addr)")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", os.Getenv("CELLFORK_METRICS_ADDR"), "also serve GET /metrics without a key on this address, e.g. 10.0.0.5:9464 (default: only on --addr, behind the API key; env CELLFORK_METRICS_ADDR)")
	fs.BoolVar(&cfg.Tracing, "tracing", os.Getenv("CELLFORK_TRACING") == "1", "export OpenTelemetry traces over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_* honoured; also on with OTEL_TRACES_EXPORTER=otlp; env CELLFORK_TRACING=1)")
	fs.StringVar(&cfg.UpstreamCA, "upstream-ca", os.Getenv("CELLFORK_UPSTREAM_CA"), "PEM file of root certificates the egress proxy trusts, besides the host's, when it connects to hosts with network rules (env CELLFORK_UPSTREAM_CA)")
	fs.StringVar(&cfg.Store.URL, "store", os.Getenv("CELLFORK_STORE"), "chunk store snapshot images are uploaded to: file:///dir or s3://bucket/prefix (AWS_ENDPOINT_URL_S3, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY honoured), or none (default file://DATA_DIR/store; env CELLFORK_STORE)")
	storeCacheMB := fs.Int64("store-cache-mb", 4096, "budget (MiB) of the host-local chunk cache of an s3:// store, in DATA_DIR/store-cache (0 = no cache)")
	fs.DurationVar(&cfg.StoreGCInterval, "store-gc-interval", 10*time.Minute, "how often the chunk store is collected (0 = never)")
	fs.DurationVar(&cfg.StoreGCGrace, "store-gc-grace", time.Hour, "how old chunks and manifests that no snapshot names must be before a collection deletes them")
	b := &cfg.Build
	fs.IntVar(&b.CPUs, "build-cpus", 1, "CPUs of each template build step's sandbox")
	fs.IntVar(&b.MemoryMB, "build-memory-mb", 2048, "memory (MiB) of each template build step's sandbox")
	fs.IntVar(&b.DiskMB, "build-disk-mb", 8192, "most a template build step (or a base image) may write, in MiB; past it the step is stopped")
	fs.DurationVar(&b.Timeout, "build-timeout", 30*time.Minute, "longest a whole template build may run")
	fs.DurationVar(&b.StepTimeout, "build-step-timeout", 15*time.Minute, "longest one template build step may run")
	fs.DurationVar(&b.ReadyTimeout, "ready-timeout", 5*time.Minute, "longest a template's start command may take to pass its ready check")
	fs.IntVar(&b.Concurrency, "build-concurrency", 1, "template builds run at once; more wait in line")
	fs.IntVar(&b.Queue, "build-queue", 16, "template builds that may wait in line before a start is refused with 503")
	tcapMB := fs.Int64("template-cap-mb", 51200, "disk (MiB) custom templates, their layers and uploads may use; a build over it collects unused layers, then fails with 507 (0 = no cap)")
	tuploadMB := fs.Int64("template-upload-mb", 4096, "largest file upload for a template build (COPY context, image archive), in MiB")
	fs.IntVar(&b.PoolReady, "pool-ready-custom", 1, "sandboxes of each custom template kept ready to hand out (0 = none: creates restore its image)")
	fs.DurationVar(&b.LayerTTL, "layer-ttl", 24*time.Hour, "how long build layers and uploads that no template uses are kept for later builds")
	b.Mirrors = map[string]string{}
	fs.Func("registry-mirror", "pull images of REGISTRY from MIRROR instead, as REGISTRY=HOST[:PORT] (repeatable; docker.io is Docker Hub)", func(v string) error {
		return daemon.ParseMirror(v, b.Mirrors)
	})
	verbose := fs.Bool("v", false, "log every request")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	for _, s := range strings.Split(*dns, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.DNS = append(cfg.DNS, s)
		}
	}
	cfg.MaxUploadBytes = *uploadMB << 20
	cfg.SnapshotCapBytes = *capMB << 20
	cfg.Store.CacheBytes = *storeCacheMB << 20
	b.CapBytes, b.UploadBytes = *tcapMB<<20, *tuploadMB<<20
	if keys := os.Getenv("CELLFORK_API_KEY"); keys != "" {
		for _, k := range strings.Split(keys, ",") {
			if k = strings.TrimSpace(k); k != "" {
				cfg.APIKeys = append(cfg.APIKeys, k)
			}
		}
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := daemon.Run(ctx, cfg, log, os.Stderr); err != nil {
		return fatalf("%v", err)
	}
	return 0
}

// builtinBuild reports whether `cellfork template ARGS` builds a built-in
// template's root filesystem on this host (`template build`, with
// --data-dir or --agent-dir or a built-in name) rather than a custom
// template on a daemon (internal/cli).
func builtinBuild(args []string) bool {
	if len(args) == 0 || args[0] != "build" {
		return false
	}
	rest := args[1:]
	for i := 0; i < len(rest); i++ {
		a := strings.TrimPrefix(rest[i], "-")
		switch {
		case a == "-data-dir" || a == "data-dir" || a == "-agent-dir" || a == "agent-dir":
			i++ // its value
		case strings.HasPrefix(a, "-data-dir=") || strings.HasPrefix(a, "data-dir=") ||
			strings.HasPrefix(a, "-agent-dir=") || strings.HasPrefix(a, "agent-dir="):
		default:
			if _, err := template.Resolve(rest[i]); err != nil {
				return false
			}
		}
	}
	return true
}

func templateCmd(ctx context.Context, args []string) int {
	if len(args) == 0 || args[0] != "build" {
		return fatalf("usage: cellfork template build [--data-dir DIR] [NAME]")
	}
	fs := flag.NewFlagSet("template build", flag.ContinueOnError)
	dataDir := fs.String("data-dir", envOr("CELLFORK_DATA_DIR", "/var/lib/cellfork"), "data directory")
	agentDir := fs.String("agent-dir", defaultAgentDir(), "directory with cellfork-agent and its kernels (kernel.py...)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	name := "base"
	if fs.NArg() > 0 {
		name = fs.Arg(0)
	}
	resolved, err := template.Resolve(name)
	if err != nil {
		return fatalf("%v", err)
	}
	reg := template.NewRegistry(filepath.Join(*dataDir, "templates"), *agentDir)
	p, err := reg.Rootfs(ctx, resolved, os.Stderr)
	if err != nil {
		return fatalf("%v", err)
	}
	os.Stderr.WriteString("template " + resolved + ": ready at " + p + "\n")
	return 0
}
