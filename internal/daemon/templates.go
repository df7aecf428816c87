package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/manager"
	"github.com/cellfork/cellfork/internal/oci"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
	"github.com/cellfork/cellfork/internal/templates"
	"github.com/cellfork/cellfork/internal/templates/build"
	"github.com/cellfork/cellfork/internal/templates/layers"
)

// BuildConfig configures custom template builds (docs/configuration.md).
type BuildConfig struct {
	// CPUs and MemoryMB of each build step's sandbox; DiskMB bounds what
	// one step (or an image) writes.
	CPUs     int
	MemoryMB int
	DiskMB   int
	// Timeout bounds a whole build, StepTimeout one step, ReadyTimeout a
	// start command's ready check.
	Timeout      time.Duration
	StepTimeout  time.Duration
	ReadyTimeout time.Duration
	// Concurrency builds run at once; Queue more may wait.
	Concurrency int
	Queue       int
	// CapBytes bounds the disk templates use (0: no cap); UploadBytes one
	// upload.
	CapBytes    int64
	UploadBytes int64
	// PoolReady sandboxes of each custom template are kept ready.
	PoolReady int
	// LayerTTL keeps unreferenced layers and uploads for later builds.
	LayerTTL time.Duration
	// Mirrors maps registry hosts to mirrors ("docker.io" for Docker Hub).
	Mirrors map[string]string
}

func (c *BuildConfig) validate() []error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int64
		min  int64
	}{
		{"--build-cpus", int64(c.CPUs), 1}, {"--build-memory-mb", int64(c.MemoryMB), int64(sandbox.MinLimits.MemoryMB)},
		{"--build-disk-mb", int64(c.DiskMB), 16}, {"--build-timeout", int64(c.Timeout), int64(time.Second)},
		{"--build-step-timeout", int64(c.StepTimeout), int64(time.Second)}, {"--ready-timeout", int64(c.ReadyTimeout), int64(time.Second)},
		{"--build-concurrency", int64(c.Concurrency), 1}, {"--build-queue", int64(c.Queue), 0},
		{"--template-cap-mb", c.CapBytes, 0}, {"--template-upload-mb", c.UploadBytes, 1 << 20},
		{"--pool-ready-custom", int64(c.PoolReady), 0}, {"--layer-ttl", int64(c.LayerTTL), int64(time.Minute)},
	} {
		if f.v < f.min {
			errs = append(errs, fmt.Errorf("%s must be at least %d", f.name, f.min))
		}
	}
	return errs
}

// openTemplates wires the custom template service to the manager: the
// builder boots its sandboxes through the manager, and the manager
// resolves template ids and keeps ready sandboxes through the service.
func openTemplates(cfg Config, m *manager.Manager, tpl *template.Registry, shared templates.Shared, log *slog.Logger) (*templates.Service, error) {
	dir := filepath.Join(cfg.DataDir, "custom-templates")
	ls, err := layers.Open(filepath.Join(dir, "layers"))
	if err != nil {
		return nil, fmt.Errorf("opening the template layers: %w", err)
	}
	var svc *templates.Service
	b := cfg.Build
	builder := build.New(build.Config{
		Layers: ls,
		Puller: &oci.Puller{Mirrors: b.Mirrors},
		Runner: runner{m},
		Agent:  tpl,
		Files:  func(hash string) (string, bool) { return svc.FilePath(hash) },
		BaseRootfs: func(ctx context.Context) (string, error) {
			return tpl.Rootfs(ctx, "base", io.Discard)
		},
		Parent: func(ctx context.Context, id string) (build.Parent, error) {
			if name, err := template.Resolve(id); err == nil {
				rootfs, err := tpl.Rootfs(ctx, name, io.Discard)
				if err != nil {
					return build.Parent{}, err
				}
				c := build.Context{User: "user", Env: map[string]string{}}
				l, err := ls.AddExternal(layers.Key("builtin", rootfs), rootfs, "FROM "+name, c)
				if err != nil {
					return build.Parent{}, err
				}
				return build.Parent{Layers: []string{l.ID}, Context: c}, nil
			}
			return svc.Parent(ctx, id)
		},
		Limits:        sandbox.Limits{CPUCount: b.CPUs, MemoryMB: b.MemoryMB, DiskMB: cfg.DefaultLimits.DiskMB},
		MaxLayerBytes: int64(b.DiskMB) << 20,
		StepTimeout:   b.StepTimeout,
		ReadyTimeout:  b.ReadyTimeout,
	})
	svc, err = templates.Open(templates.Config{
		Dir: dir, Builder: builder, Layers: ls, Pool: pool{m}, Log: log,
		Defaults: cfg.DefaultLimits, MaxLimits: cfg.MaxLimits, Reserved: reservedNames(),
		Concurrency: b.Concurrency, Queue: b.Queue, Timeout: b.Timeout, MaxUploadBytes: b.UploadBytes,
		CapBytes: b.CapBytes, PoolReady: b.PoolReady, LayerTTL: b.LayerTTL, Shared: shared,
	})
	if err != nil {
		return nil, err
	}
	m.SetCustomTemplates(resolver{svc})
	return svc, nil
}

// reservedNames are the built-in templates' ids and aliases.
func reservedNames() []string {
	var out []string
	for _, n := range template.Names() {
		out = append(out, template.Aliases(n)...)
	}
	return out
}

// runner adapts the manager to build.Runner.
type runner struct{ m *manager.Manager }

func (r runner) Boot(ctx context.Context, rootfs string, limits sandbox.Limits, writable bool, env ...string) (build.Box, error) {
	b, err := r.m.BootBuild(ctx, rootfs, limits, writable, env...)
	if err != nil {
		return nil, err
	}
	return b, nil
}

func (r runner) BootKey(limits sandbox.Limits) string { return r.m.BootKey(limits) }

// pool adapts the manager to templates.Pool.
type pool struct{ m *manager.Manager }

func (p pool) WarmCustom(r templates.Resolved, ready int) {
	p.m.WarmCustom(manager.CustomTemplate{Key: r.Key, Rootfs: r.Rootfs, Image: r.Image, Limits: r.Limits}, ready)
}

func (p pool) UnwarmCustom(key string) { p.m.UnwarmCustom(key) }

func (p pool) RootfsInUse(ctx context.Context) (map[string]bool, error) { return p.m.RootfsInUse(ctx) }

// resolver adapts the service to manager.CustomTemplates.
type resolver struct{ s *templates.Service }

func (r resolver) ResolveTemplate(ctx context.Context, id string) (manager.CustomTemplate, error) {
	t, err := r.s.ResolveTemplate(ctx, id)
	if err != nil {
		return manager.CustomTemplate{}, err
	}
	return manager.CustomTemplate{Key: t.Key, Rootfs: t.Rootfs, Image: t.Image, Limits: t.Limits}, nil
}

func (r resolver) LocalRoot(ctx context.Context, team, rootfs string) (string, error) {
	return r.s.LocalRoot(ctx, team, rootfs)
}

// ParseMirror parses --registry-mirror REGISTRY=MIRROR.
func ParseMirror(v string, into map[string]string) error {
	reg, mirror, ok := strings.Cut(v, "=")
	if !ok || reg == "" || mirror == "" || strings.ContainsAny(mirror, "/ ") {
		return errdefs.New(errdefs.ErrInvalidArgument, "--registry-mirror %q: want REGISTRY=HOST[:PORT], like docker.io=127.0.0.1:5000", v)
	}
	if reg == "docker.io" {
		reg = "index.docker.io"
	}
	into[reg] = mirror
	return nil
}
