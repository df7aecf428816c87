// Package templates keeps the custom templates of one daemon: their
// records (names, tags, builds), the files uploaded for their COPY steps,
// a queue that runs their builds (internal/templates/build) within limits,
// the pool registration of each template's newest build, and the
// collection of what nothing uses any more. internal/api serves it as
// E2B's template API.
package templates

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/singleflight"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/templates/build"
	"github.com/cellfork/cellfork/internal/templates/layers"
)

// Pool is what the service needs of the manager.
type Pool interface {
	// WarmCustom keeps ready sandboxes of a build (key) in the pool.
	WarmCustom(r Resolved, ready int)
	// UnwarmCustom drops them.
	UnwarmCustom(key string)
	// RootfsInUse reports the roots that sandboxes and snapshots need.
	RootfsInUse(ctx context.Context) (map[string]bool, error)
}

// Resolved is a template as a sandbox create needs it.
type Resolved struct {
	Key    string // the build id
	Rootfs string
	Image  string
	Limits sandbox.Limits
}

// Builder runs builds (build.Builder; tests use a fake).
type Builder interface {
	Build(ctx context.Context, job build.Job) (*build.Result, error)
	WarmKey(sp build.Spec, c build.Context, limits sandbox.Limits) (string, error)
	Warm(ctx context.Context, rootfs string, sp build.Spec, c build.Context, limits sandbox.Limits, image string, log func(build.Entry)) error
	InstallAgent(rootfs string) error
	AgentLayerName() (string, error)
}

// Config configures the service. Zero values take the defaults noted.
type Config struct {
	Dir     string // <data-dir>/custom-templates
	Builder Builder
	Layers  *layers.Store
	Pool    Pool
	Log     *slog.Logger
	// Defaults are a template's sandbox limits where its build request
	// does not set them; MaxLimits bound what it may ask.
	Defaults  sandbox.Limits
	MaxLimits sandbox.Limits
	// Reserved names (the built-in templates').
	Reserved []string
	// Concurrency is how many builds run at once (1); Queue how many more
	// may wait (16).
	Concurrency int
	Queue       int
	// Timeout bounds a whole build (30 minutes).
	Timeout time.Duration
	// MaxUploadBytes bounds one uploaded file (COPY context or image
	// archive).
	MaxUploadBytes int64
	// CapBytes bounds the disk used by layers, builds and uploads (0: no
	// cap): a build that would start above it fails after collecting
	// unused layers.
	CapBytes int64
	// PoolReady is how many ready sandboxes the pool keeps of each
	// template's newest build (0: none; creates restore its image).
	PoolReady int
	// LayerTTL is how long a layer or upload nothing refers to is kept
	// for later builds (24 hours).
	LayerTTL time.Duration
	// Shared is the cluster's store of built templates (shared.go); nil
	// on a single host.
	Shared Shared
}

// Service is the custom template store. Safe for concurrent use.
type Service struct {
	cfg   Config
	log   *slog.Logger
	slots chan struct{}

	mu      sync.Mutex
	st      *state                        // guarded by mu
	logs    map[string]*buildLog          // guarded by mu: live logs by build id
	cancels map[string]context.CancelFunc // guarded by mu: started builds
	active  int                           // guarded by mu: started, not finished

	stopped context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup

	syncMu   sync.Mutex // one syncShared at a time
	pulls    singleflight.Group
	pulledMu sync.Mutex // a pulled build's use against its collection
}

// Open loads the records in cfg.Dir. Builds that a previous daemon left
// unfinished are marked failed.
func Open(cfg Config) (*Service, error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 16
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Minute
	}
	if cfg.LayerTTL <= 0 {
		cfg.LayerTTL = 24 * time.Hour
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "files"), filepath.Join(cfg.Dir, "builds")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	st, err := loadState(filepath.Join(cfg.Dir, "templates.json"))
	if err != nil {
		return nil, fmt.Errorf("loading template records: %w", err)
	}
	s := &Service{cfg: cfg, log: cfg.Log, slots: make(chan struct{}, cfg.Concurrency), st: st,
		logs: map[string]*buildLog{}, cancels: map[string]context.CancelFunc{}}
	s.stopped, s.stop = context.WithCancel(context.Background())
	removeGone(filepath.Join(cfg.Dir, "builds"))
	now := time.Now().UTC()
	for _, t := range st.Templates {
		for _, b := range t.Builds {
			if b.Status == StatusBuilding {
				b.Status, b.UpdatedAt, b.FinishedAt = StatusError, now, &now
				b.Reason = &Reason{Message: "the daemon stopped during the build; start it again"}
				_ = os.RemoveAll(filepath.Join(s.buildDir(b.ID), "rootfs"))
			}
		}
	}
	return s, s.saveLocked()
}

// Start registers each template's newest build with the pool, rebuilding
// warm images made for another agent or boot configuration, and starts the
// periodic collection.
func (s *Service) Start() {
	s.mu.Lock()
	var stale []*Template
	for _, t := range s.st.Templates {
		b := t.latestReady()
		if b == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(b.Image, "checkpoint.img")); err == nil {
			s.cfg.Pool.WarmCustom(s.resolvedLocked(t, b), s.cfg.PoolReady)
		}
		if key, err := s.cfg.Builder.WarmKey(specOf(b), b.Context, s.limitsOf(b)); err == nil && key != b.WarmKey {
			stale = append(stale, t)
		}
	}
	s.mu.Unlock()
	for _, t := range stale {
		s.wg.Go(func() { s.rewarm(t.ID) })
	}
	s.wg.Go(s.collectLoop)
}

// Close cancels running builds and waits for them.
func (s *Service) Close() {
	s.stop()
	s.wg.Wait()
}

func (s *Service) saveLocked() error {
	return saveState(filepath.Join(s.cfg.Dir, "templates.json"), s.st)
}

func (s *Service) buildDir(id string) string { return filepath.Join(s.cfg.Dir, "builds", id) }

// FilePath returns the path of an uploaded file (build.Config.Files).
func (s *Service) FilePath(hash string) (string, bool) {
	p := filepath.Join(s.cfg.Dir, "files", hash)
	if _, err := os.Stat(p); err != nil {
		return "", false
	}
	now := time.Now()
	_ = os.Chtimes(p, now, now) // used: the collector keeps it
	return p, true
}

var (
	nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?$`)
	tagRE  = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9._-]{0,126})?$`)
	hashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// DefaultTag is the tag of builds that name none.
const DefaultTag = "default"

// SplitName splits "name:tag" (tag "" when absent).
func SplitName(s string) (name, tag string) {
	name, tag, _ = strings.Cut(s, ":")
	return name, tag
}

func validName(n string) error {
	if !nameRE.MatchString(n) {
		return errdefs.New(errdefs.ErrInvalidArgument, "template name %q must be 1-128 lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or digit", n)
	}
	return nil
}

func validTag(t string) error {
	if !tagRE.MatchString(t) {
		return errdefs.New(errdefs.ErrInvalidArgument, "tag %q must be 1-128 letters, digits, '.', '_' or '-' (no ':')", t)
	}
	return nil
}

// newTemplateID returns a 20-character id like E2B's.
func newTemplateID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	b[0] = alphabet[int(b[0])%26]
	return string(b)
}

// findLocked returns the template an id or name names, among those of
// the team ctx is scoped to (sandbox.WithTeam; a context with no team sees
// every template: a single host, and the service's own work by id).
func (s *Service) findLocked(ctx context.Context, idOrName string) *Template {
	for _, t := range s.st.Templates {
		if sandbox.Sees(ctx, t.Team) && (t.ID == idOrName || slices.Contains(t.Names, idOrName)) {
			return t
		}
	}
	return nil
}

func notFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "template %q not found", id)
}

// CreateRequest asks for a new build (of a new or existing template).
type CreateRequest struct {
	Name     string // "name" or "name:tag"
	Tags     []string
	CPUCount int
	MemoryMB int
}

// Create records a build waiting for its steps (E2B's POST /v3/templates):
// of the template named Name, made if needed.
func (s *Service) Create(ctx context.Context, req CreateRequest) (*Template, *Build, error) {
	name, tag := SplitName(req.Name)
	if err := validName(name); err != nil {
		return nil, nil, err
	}
	if slices.Contains(s.cfg.Reserved, name) {
		return nil, nil, errdefs.New(errdefs.ErrInvalidArgument, "%q is a built-in template's name", name)
	}
	tags := slices.Clone(req.Tags)
	if tag != "" {
		tags = append([]string{tag}, tags...)
	}
	for _, t := range tags {
		if err := validTag(t); err != nil {
			return nil, nil, err
		}
	}
	if len(tags) == 0 {
		tags = []string{DefaultTag}
	}
	slices.Sort(tags)
	tags = slices.Compact(tags)
	for _, v := range []struct {
		name   string
		v, max int
		min    int
	}{{"cpuCount", req.CPUCount, s.cfg.MaxLimits.CPUCount, sandbox.MinLimits.CPUCount}, {"memoryMB", req.MemoryMB, s.cfg.MaxLimits.MemoryMB, sandbox.MinLimits.MemoryMB}} {
		if v.v != 0 && (v.v < v.min || v.v > v.max) {
			return nil, nil, errdefs.New(errdefs.ErrInvalidArgument, "%s must be between %d and %d, not %d", v.name, v.min, v.max, v.v)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UTC()
	t := s.findLocked(ctx, name)
	if t == nil {
		team, _ := sandbox.TeamOf(ctx)
		t = &Template{ID: newTemplateID(), Team: team, Names: []string{name}, CreatedAt: now, Tags: map[string]TagRef{},
			CPUCount: s.cfg.Defaults.CPUCount, MemoryMB: s.cfg.Defaults.MemoryMB, DiskMB: s.cfg.Defaults.DiskMB}
		s.st.Templates = append(s.st.Templates, t)
	}
	if req.CPUCount != 0 {
		t.CPUCount = req.CPUCount
	}
	if req.MemoryMB != 0 {
		t.MemoryMB = req.MemoryMB
	}
	t.UpdatedAt = now
	supersedeWaitingLocked(t, tags, now)
	b := &Build{ID: uuid.NewString(), Status: StatusWaiting, CreatedAt: now, UpdatedAt: now,
		CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskMB: t.DiskMB, Tags: tags}
	t.Builds = append(t.Builds, b)
	if err := s.saveLocked(); err != nil {
		return nil, nil, err
	}
	return cloneTemplate(t), cloneBuild(b), nil
}

// supersedeWaitingLocked fails t's builds that were created but never
// started (a client that gave up between E2B's POST /v3/templates and the
// build's start: a COPY of files that do not exist, a killed process)
// and would get one of tags, as E2B does when a newer build is asked for.
func supersedeWaitingLocked(t *Template, tags []string, now time.Time) {
	for _, b := range t.Builds {
		if b.Status != StatusWaiting || !slices.ContainsFunc(b.Tags, func(tag string) bool { return slices.Contains(tags, tag) }) {
			continue
		}
		b.Status, b.UpdatedAt, b.FinishedAt = StatusError, now, &now
		b.Reason = &Reason{Message: "The build was canceled because it was superseded by a newer one."}
	}
}

func cloneBuild(b *Build) *Build {
	c := *b
	c.Tags = slices.Clone(b.Tags)
	c.Layers = slices.Clone(b.Layers)
	return &c
}

// FilePresent reports whether the files with hash were uploaded already
// (for template idOrName, which must exist).
func (s *Service) FilePresent(ctx context.Context, idOrName, hash string) (bool, error) {
	if !hashRE.MatchString(hash) {
		return false, errdefs.New(errdefs.ErrInvalidArgument, "files hash must be 64 lowercase hex digits")
	}
	s.mu.Lock()
	t := s.findLocked(ctx, idOrName)
	s.mu.Unlock()
	if t == nil {
		return false, notFound(idOrName)
	}
	_, ok := s.FilePath(hash)
	return ok, nil
}

// PutFile stores an upload under its hash (written beside, renamed into
// place). Larger than MaxUploadBytes: ErrResourceExhausted.
func (s *Service) PutFile(ctx context.Context, idOrName, hash string, r io.Reader) error {
	if _, err := s.FilePresent(ctx, idOrName, hash); err != nil {
		return err
	}
	dst := filepath.Join(s.cfg.Dir, "files", hash)
	f, err := os.CreateTemp(filepath.Dir(dst), "."+hash[:12]+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	n, err := io.Copy(f, io.LimitReader(r, s.cfg.MaxUploadBytes+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errdefs.New(errdefs.ErrInvalidArgument, "reading the upload: %v", err)
	}
	if n > s.cfg.MaxUploadBytes {
		return errdefs.New(errdefs.ErrResourceExhausted, "upload larger than %d MiB", s.cfg.MaxUploadBytes>>20)
	}
	return os.Rename(f.Name(), dst)
}

// StartBuild starts a waiting build with its steps (E2B's POST
// /v2/templates/{id}/builds/{build}). It runs in the background; BuildInfo
// reports on it.
func (s *Service) StartBuild(ctx context.Context, idOrName, buildID string, spec build.Spec) error {
	warnings, err := s.applyDockerfile(&spec)
	if err != nil {
		return err
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.findLocked(ctx, idOrName)
	if t == nil {
		return notFound(idOrName)
	}
	b := t.build(buildID)
	if b == nil {
		return errdefs.New(errdefs.ErrNotFound, "build %q of template %q not found", buildID, idOrName)
	}
	if b.Status != StatusWaiting {
		return errdefs.New(errdefs.ErrFailedPrecondition, "build %s is %s, not waiting: start a new build", buildID, b.Status)
	}
	if spec.FromTemplate != "" {
		name, _ := SplitName(spec.FromTemplate)
		if name == t.ID || slices.Contains(t.Names, name) {
			return errdefs.New(errdefs.ErrInvalidArgument, "a template cannot be built from itself")
		}
	}
	if s.active >= s.cfg.Concurrency+s.cfg.Queue {
		return errdefs.New(errdefs.ErrUnavailable, "%d builds are running or queued; try again later", s.active)
	}
	stored := spec
	if stored.Registry != nil { // credentials are not kept
		stored.Registry = &build.Registry{Type: spec.Registry.Type}
	}
	lg, err := openBuildLog(s.buildDir(b.ID))
	if err != nil {
		return err
	}
	for _, w := range warnings {
		lg.add(LogEntry{Timestamp: time.Now().UTC(), Level: "warn", Message: "Dockerfile: " + w, Step: build.StepBase})
	}
	now := time.Now().UTC()
	b.Status, b.UpdatedAt, b.Spec = StatusBuilding, now, &stored
	if err := s.saveLocked(); err != nil {
		lg.close()
		b.Status = StatusWaiting
		return err
	}
	// The build runs on after this request, as its team: a fromTemplate
	// sees that team's templates.
	bctx := s.stopped
	if team, ok := sandbox.TeamOf(ctx); ok {
		bctx = sandbox.WithTeam(bctx, team)
	}
	ctx, cancel := context.WithTimeoutCause(bctx, s.cfg.Timeout,
		errdefs.New(errdefs.ErrResourceExhausted, "the build ran longer than the limit of %s and was stopped", s.cfg.Timeout))
	s.logs[b.ID], s.cancels[b.ID] = lg, cancel
	s.active++
	limits := s.limitsOf(b)
	s.wg.Go(func() { s.run(ctx, t.ID, b.ID, spec, limits, lg) })
	return nil
}

// limitsOf is the sandbox limits a build's template has.
func (s *Service) limitsOf(b *Build) sandbox.Limits {
	return s.cfg.Defaults.Over(sandbox.Limits{CPUCount: b.CPUCount, MemoryMB: b.MemoryMB, DiskMB: b.DiskMB})
}

func specOf(b *Build) build.Spec {
	if b.Spec == nil {
		return build.Spec{}
	}
	return *b.Spec
}

// run runs one build: waits for a slot, builds, records the outcome.
func (s *Service) run(ctx context.Context, templateID, buildID string, spec build.Spec, limits sandbox.Limits, lg *buildLog) {
	logf := func(e build.Entry) {
		lg.add(LogEntry{Timestamp: time.Now().UTC(), Level: e.Level, Message: e.Message, Step: e.Step})
	}
	defer func() {
		s.mu.Lock()
		delete(s.cancels, buildID)
		delete(s.logs, buildID)
		s.active--
		s.mu.Unlock()
		lg.close()
	}()
	select {
	case s.slots <- struct{}{}:
	default:
		logf(build.Entry{Level: "info", Message: "Waiting for a build slot (other builds are running)"})
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			s.finish(templateID, buildID, nil, &build.StepError{Step: build.StepBase, Err: context.Cause(ctx)}, lg)
			return
		}
	}
	defer func() { <-s.slots }()
	if err := s.checkCap(ctx); err != nil {
		s.finish(templateID, buildID, nil, &build.StepError{Step: build.StepBase, Err: err}, lg)
		return
	}
	t0 := time.Now()
	res, err := s.cfg.Builder.Build(ctx, build.Job{Spec: spec, Limits: limits, Dir: s.buildDir(buildID), Log: logf})
	if err == nil && s.cfg.Shared != nil {
		logf(build.Entry{Level: "info", Step: build.StepFinalize, Message: "Publishing the template to the cluster's chunk store"})
		if perr := s.publish(ctx, templateID, buildID, spec, limits, res, logf); perr != nil {
			err = &build.StepError{Step: build.StepFinalize, Err: perr}
		}
	}
	if err != nil && ctx.Err() != nil {
		err = &build.StepError{Step: stepOf(err), Err: context.Cause(ctx)}
	}
	s.log.Info("template build finished", "template.id", templateID, "build.id", buildID, "ms", time.Since(t0).Milliseconds(), "err", err)
	s.finish(templateID, buildID, res, err, lg)
}

func stepOf(err error) string {
	var se *build.StepError
	if errors.As(err, &se) {
		return se.Step
	}
	return ""
}

// finish records a build's outcome; a ready build gets its tags and
// becomes what the pool keeps.
func (s *Service) finish(templateID, buildID string, res *build.Result, err error, lg *buildLog) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.findLocked(context.Background(), templateID)
	if t == nil { // deleted meanwhile
		s.removeLater(s.buildDir(buildID))
		return
	}
	b := t.build(buildID)
	if b == nil {
		return
	}
	now := time.Now().UTC()
	b.UpdatedAt, b.FinishedAt = now, &now
	if err != nil {
		msg := errdefs.UserMessage(err)
		if msg == "" {
			msg = err.Error()
		}
		b.Status = StatusError
		entries := lg.snapshot()
		b.Reason = &Reason{Message: msg, Step: stepOf(err), Logs: entries[max(0, len(entries)-20):]}
		lg.add(LogEntry{Timestamp: now, Level: "error", Message: "Build failed: " + msg, Step: b.Reason.Step})
		keep := filepath.Join(s.buildDir(buildID), "log.jsonl")
		entriesDir, _ := os.ReadDir(s.buildDir(buildID))
		for _, e := range entriesDir {
			if p := filepath.Join(s.buildDir(buildID), e.Name()); p != keep {
				_ = os.RemoveAll(p)
			}
		}
		_ = s.saveLocked()
		return
	}
	prev := t.latestReady()
	b.Status, b.Layers, b.Context, b.Rootfs, b.Image, b.WarmKey, b.Cached = StatusReady, res.Layers, res.Context, res.Rootfs, res.Image, res.WarmKey, res.Cached
	for _, tag := range b.Tags {
		t.Tags[tag] = TagRef{BuildID: b.ID, CreatedAt: now}
	}
	t.UpdatedAt = now
	_ = s.saveLocked()
	s.cfg.Pool.WarmCustom(s.resolvedLocked(t, b), s.cfg.PoolReady)
	if prev != nil {
		s.cfg.Pool.UnwarmCustom(prev.ID)
	}
	team := t.Team
	s.wg.Go(func() { s.syncShared(team, templateID) })
	s.wg.Go(func() { s.collect(context.Background()) })
}

// Cancel stops a started build (E2B has no such call; deleting a template
// does it).
func (s *Service) cancelLocked(buildID string) {
	if c := s.cancels[buildID]; c != nil {
		c()
	}
}

func (s *Service) resolvedLocked(t *Template, b *Build) Resolved {
	return Resolved{Key: b.ID, Rootfs: b.Rootfs, Image: b.Image, Limits: s.limitsOf(b)}
}
