package build

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/oci"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/templates/layers"
)

// Box is one sandbox a build runs in.
type Box interface {
	// Transport reaches the sandbox's ports ("http://sandbox:<port>").
	Transport() http.RoundTripper
	// Checkpoint saves the sandbox's whole state into dir (which must not
	// exist) and stops it.
	Checkpoint(ctx context.Context, dir string) error
	// Destroy frees the sandbox.
	Destroy(ctx context.Context)
}

// Runner starts the sandboxes builds run in. The manager implements it.
type Runner interface {
	// Boot starts a sandbox running the agent on rootfs. With writable,
	// the sandbox writes straight to rootfs (a build step's overlay);
	// otherwise it writes to an in-memory overlay, as every sandbox does.
	// env is added to the agent's boot environment.
	Boot(ctx context.Context, rootfs string, limits sandbox.Limits, writable bool, env ...string) (Box, error)
	// BootKey describes what a checkpoint of a sandbox booted with limits
	// freezes of the boot configuration: a warm image built under another
	// key must be rebuilt.
	BootKey(limits sandbox.Limits) string
}

// Agent installs the in-sandbox agent (internal/template.Registry).
type Agent interface {
	InstallAgent(rootfs string) error
	AgentPath() (string, error)
}

// Config is what a Builder needs. Every field is set.
type Config struct {
	Layers *layers.Store
	Puller *oci.Puller
	Runner Runner
	Agent  Agent
	// Files returns the path of an uploaded file by its hash.
	Files func(hash string) (string, bool)
	// BaseRootfs returns the built-in template's root file system.
	BaseRootfs func(ctx context.Context) (string, error)
	// Parent resolves a fromTemplate to the layers and context of its
	// newest ready build.
	Parent func(ctx context.Context, template string) (Parent, error)
	// Limits are the build sandboxes' CPUs and memory.
	Limits sandbox.Limits
	// MaxLayerBytes bounds what one step (or an image) may write.
	MaxLayerBytes int64
	// StepTimeout bounds one step; ReadyTimeout the start command's ready
	// check.
	StepTimeout  time.Duration
	ReadyTimeout time.Duration
}

// Parent is a template a build starts from.
type Parent struct {
	Layers  []string
	Context Context
}

// Builder runs builds. Safe for concurrent use (the caller queues them).
type Builder struct {
	cfg Config
}

// New returns a Builder.
func New(cfg Config) *Builder { return &Builder{cfg: cfg} }

// Entry is one line of a build's log.
type Entry struct {
	Level   string // debug, info, warn, error
	Step    string // "base", "1"..."N", "finalize"; "" for the build as a whole
	Message string
}

// Job is one build to run.
type Job struct {
	Spec Spec
	// Limits are the template's: its sandboxes' CPUs, memory and disk, and
	// the process limits its warm image boots with.
	Limits sandbox.Limits
	// Dir receives the result: Dir/rootfs and Dir/warm-<key>.
	Dir string
	Log func(Entry)
}

// Result is a finished build.
type Result struct {
	Layers  []string // bottom first
	Context Context  // the sandboxes' default user, workdir and environment
	Rootfs  string
	Image   string // warm image
	WarmKey string
	Cached  int // steps served from the cache
}

// StepError is a build failure and the step it happened in (E2B's
// BuildStatusReason.step).
type StepError struct {
	Step string
	Err  error
}

func (e *StepError) Error() string { return e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// Step names outside the numbered steps, as E2B's SDKs expect them.
const (
	StepBase     = "base"
	StepFinalize = "finalize"
)

func stepErr(step string, err error) error {
	var se *StepError
	if errors.As(err, &se) {
		return err
	}
	return &StepError{Step: step, Err: err}
}

// Build runs job: the base, each step (from the cache where its inputs are
// unchanged), then the finishing (flatten, agent, warm image). On failure
// nothing is left in job.Dir; the layers made so far stay cached.
func (b *Builder) Build(ctx context.Context, job Job) (*Result, error) {
	t0 := time.Now()
	log := func(level, step, format string, args ...any) {
		job.Log(Entry{Level: level, Step: step, Message: fmt.Sprintf(format, args...)})
	}
	chain, c, err := b.base(ctx, job, log)
	if err != nil {
		return nil, stepErr(StepBase, err)
	}
	n := len(job.Spec.Steps)
	cached := 0
	for i, st := range job.Spec.Steps {
		step := strconv.Itoa(i + 1)
		prefix := fmt.Sprintf("[builder %d/%d]", i+1, n)
		top := chain[len(chain)-1]
		key := layers.Key("step", top, st.canonical(), c.canonical())
		force := job.Spec.Force || st.Force
		if l, ok := b.cfg.Layers.Lookup(key); ok && !force {
			var lc Context
			if json.Unmarshal(l.Meta, &lc) == nil {
				log("info", step, "CACHED %s %s", prefix, st)
				if l.ID != top {
					chain = append(chain, l.ID)
				}
				c = lc
				cached++
				continue
			}
		}
		log("info", step, "%s %s", prefix, st)
		next, nc, err := b.step(ctx, job, chain, key, c, st, step, log)
		if err != nil {
			return nil, stepErr(step, err)
		}
		chain, c = next, nc
	}
	if cached > 0 {
		log("info", "", "%d of %d steps came from the cache", cached, n)
	}
	if len(chain) > layers.MaxDepth {
		return nil, stepErr(StepFinalize, invalid("the template stacks %d layers, more than %d", len(chain), layers.MaxDepth))
	}
	b.cfg.Layers.Touch(chain...)
	res, err := b.finish(ctx, job, chain, c, log)
	if err != nil {
		return nil, stepErr(StepFinalize, err)
	}
	res.Cached = cached
	log("info", "", "Build finished in %s", time.Since(t0).Round(10*time.Millisecond))
	return res, nil
}

// base makes (or finds) the layers the steps start from, and the context
// they start with.
func (b *Builder) base(ctx context.Context, job Job, log func(string, string, string, ...any)) ([]string, Context, error) {
	sp := job.Spec
	root := Context{User: "root", Env: map[string]string{}}
	switch {
	case sp.FromTemplate != "":
		p, err := b.cfg.Parent(ctx, sp.FromTemplate)
		if err != nil {
			return nil, Context{}, err
		}
		log("info", StepBase, "FROM template %s", sp.FromTemplate)
		return p.Layers, p.Context.clone(), nil
	case sp.FromImage != "" && slices.Contains(BaseImages, sp.FromImage):
		rootfs, err := b.cfg.BaseRootfs(ctx)
		if err != nil {
			return nil, Context{}, err
		}
		log("info", StepBase, "FROM %s (the built-in base template)", sp.FromImage)
		l, err := b.cfg.Layers.AddExternal(layers.Key("builtin", rootfs), rootfs, "FROM "+sp.FromImage, root)
		if err != nil {
			return nil, Context{}, err
		}
		return []string{l.ID}, root, nil
	}
	img, what, cleanup, err := b.image(ctx, sp, log)
	if err != nil {
		return nil, Context{}, err
	}
	defer cleanup()
	digest, err := oci.Digest(img)
	if err != nil {
		return nil, Context{}, fmt.Errorf("reading the image's digest: %w", err)
	}
	cfg, err := oci.ImageConfig(img)
	if err != nil {
		return nil, Context{}, err
	}
	c := root.clone()
	for _, kv := range cfg.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			c.Env[k] = v
		}
	}
	key := layers.Key("image", digest)
	l, ok := b.cfg.Layers.Lookup(key)
	if !ok || sp.Force {
		log("info", StepBase, "FROM %s: unpacking %s", what, digest)
		p, err := b.cfg.Layers.Begin(key, "")
		if err != nil {
			return nil, Context{}, err
		}
		if err := oci.Unpack(ctx, img, p.Diff(), b.cfg.MaxLayerBytes); err != nil {
			p.Abort()
			return nil, Context{}, err
		}
		if l, err = p.Commit("FROM "+what, c); err != nil {
			p.Abort()
			return nil, Context{}, err
		}
	} else {
		log("info", StepBase, "CACHED FROM %s (%s)", what, digest)
	}
	// Every image gets what the agent and sandboxes need (user `user`,
	// hosts, resolver); a layer of its own, cached like a step.
	pkey := layers.Key("provision", l.ID, provisionScript)
	if pl, ok := b.cfg.Layers.Lookup(pkey); ok && !sp.Force {
		return []string{l.ID, pl.ID}, c, nil
	}
	log("info", StepBase, "provisioning the image for cellfork (user `user`, hosts, resolver)")
	chain, _, err := b.inSandbox(ctx, []string{l.ID}, pkey, c, "provision", func(ctx context.Context, a *agent, shell string) (Context, error) {
		err := a.run(ctx, command{shell: "/bin/sh", cmd: provisionScript, c: Context{User: "root", Env: map[string]string{}},
			out: func(line string, _ bool) { log("debug", StepBase, "%s", line) }})
		if err != nil {
			return c, fmt.Errorf("provisioning the image: %w", err)
		}
		return c, nil
	})
	if err != nil {
		return nil, Context{}, err
	}
	return chain, c, nil
}

// image gets the image a spec starts from.
func (b *Builder) image(ctx context.Context, sp Spec, log func(string, string, string, ...any)) (img imageT, what string, cleanup func(), err error) {
	if sp.FromImageFile != "" {
		path, ok := b.cfg.Files(sp.FromImageFile)
		if !ok {
			return nil, "", nil, errdefs.New(errdefs.ErrNotFound, "the image archive %s was not uploaded", sp.FromImageFile)
		}
		log("info", StepBase, "FROM image archive %s", sp.FromImageFile[:12])
		i, cleanup, err := oci.Load(path)
		if err != nil {
			return nil, "", nil, err
		}
		return i, "image archive " + sp.FromImageFile[:12], cleanup, nil
	}
	auth := oci.Auth{}
	if r := sp.Registry; r != nil {
		switch r.Type {
		case "registry":
			auth = oci.Auth{Username: r.Username, Password: r.Password}
		case "gcp":
			auth = oci.Auth{Username: "_json_key", Password: r.ServiceAccountJSON}
		}
	}
	log("info", StepBase, "FROM %s: pulling", sp.FromImage)
	i, err := b.cfg.Puller.Pull(ctx, sp.FromImage, auth)
	if err != nil {
		return nil, "", nil, err
	}
	return i, sp.FromImage, func() {}, nil
}

// inSandbox makes a layer for key on chain by running fn in a build
// sandbox whose root is the chain with the new layer on top. It returns
// the chain with the layer and the context fn left.
func (b *Builder) inSandbox(ctx context.Context, chain []string, key string, c Context, what string,
	fn func(ctx context.Context, a *agent, shell string) (Context, error)) ([]string, Context, error) {
	if len(chain)+1 > layers.MaxDepth {
		return nil, c, invalid("the template stacks more than %d layers", layers.MaxDepth)
	}
	agentLayer, err := b.agentLayer()
	if err != nil {
		return nil, c, err
	}
	p, err := b.cfg.Layers.Begin(key, chain[len(chain)-1])
	if err != nil {
		return nil, c, err
	}
	committed := false
	defer func() {
		if !committed {
			p.Abort()
		}
	}()
	lowers := []string{agentLayer}
	for i := len(chain) - 1; i >= 0; i-- {
		lowers = append(lowers, layers.LowerPath(chain[i]))
	}
	if err := p.Mount(ctx, lowers); err != nil {
		return nil, c, err
	}
	shell := "/bin/sh"
	if exists(p.Merged(), "/bin/bash") {
		shell = "/bin/bash"
	} else if !exists(p.Merged(), "/bin/sh") {
		return nil, c, invalid("the image has no /bin/sh: build steps run in a shell")
	}
	sctx, cancel := context.WithTimeoutCause(ctx, b.cfg.StepTimeout,
		errdefs.New(errdefs.ErrResourceExhausted, "the step ran longer than the build step limit of %s and was stopped", b.cfg.StepTimeout))
	defer cancel()
	box, err := b.cfg.Runner.Boot(sctx, p.Merged(), b.cfg.Limits, true, "CELLFORK_CODE_CONTEXT=off")
	if err != nil {
		return nil, c, fmt.Errorf("starting the build sandbox: %w", err)
	}
	defer box.Destroy(context.WithoutCancel(ctx))
	a := newAgent(box.Transport())
	if err := a.init(sctx, Context{User: "root"}, b.cfg.MaxLayerBytes+1<<20); err != nil {
		return nil, c, err
	}
	wctx, stopWatch := context.WithCancelCause(sctx)
	defer stopWatch(nil)
	go b.watchDisk(wctx, stopWatch, p.Diff())
	nc, err := fn(wctx, a, shell)
	if cause := context.Cause(wctx); cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause // the disk or time limit, not what it did to the command
	}
	if err != nil {
		return nil, c, err
	}
	box.Destroy(context.WithoutCancel(ctx))
	// The watch samples; a step that wrote fast may have ended between.
	if n, _ := layers.DiskUsage(nil, p.Diff()); n > b.cfg.MaxLayerBytes {
		return nil, c, errdefs.New(errdefs.ErrResourceExhausted, "the step wrote %d MiB, more than the build disk limit of %d MiB", n>>20, b.cfg.MaxLayerBytes>>20)
	}
	l, err := p.Commit(what, nc)
	if err != nil {
		return nil, c, err
	}
	committed = true
	return append(slices.Clone(chain), l.ID), nc, nil
}

// watchDisk stops the step (through stop) once its layer outgrows the
// limit.
func (b *Builder) watchDisk(ctx context.Context, stop context.CancelCauseFunc, diff string) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, _ := layers.DiskUsage(nil, diff); n > b.cfg.MaxLayerBytes {
			stop(errdefs.New(errdefs.ErrResourceExhausted, "the step wrote more than the build disk limit of %d MiB and was stopped", b.cfg.MaxLayerBytes>>20))
			return
		}
	}
}

// AgentLayerName is the directory (in the layer store) of this agent
// version's layer.
func (b *Builder) AgentLayerName() (string, error) {
	p, err := b.cfg.Agent.AgentPath()
	if err != nil {
		return "", err
	}
	return "agent-" + filepath.Base(filepath.Dir(p)), nil
}

// InstallAgent installs this version's agent into a template's root.
func (b *Builder) InstallAgent(rootfs string) error { return b.cfg.Agent.InstallAgent(rootfs) }

// agentLayer returns the lower directory holding this version's agent (and
// the /tmp marker), made once per agent version.
func (b *Builder) agentLayer() (string, error) {
	p, err := b.cfg.Agent.AgentPath()
	if err != nil {
		return "", err
	}
	name, _ := b.AgentLayerName()
	dir := filepath.Join(b.cfg.Layers.Dir(), name)
	if _, err := os.Stat(filepath.Join(dir, "diff", strings.TrimPrefix(p, "/"))); err == nil {
		return name + "/diff", nil
	}
	tmp := dir + ".tmp-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.MkdirAll(filepath.Join(tmp, "diff"), 0o755); err != nil {
		return "", err
	}
	if err := b.cfg.Agent.InstallAgent(filepath.Join(tmp, "diff")); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Stat(dir); serr != nil {
			return "", err
		}
	}
	return name + "/diff", nil
}

// exists reports whether path exists in the root (symbolic links resolved
// inside it).
func exists(root, path string) bool {
	p, err := securejoin.SecureJoin(root, path)
	if err != nil {
		return false
	}
	_, err = os.Stat(p)
	return err == nil
}
