package templates

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/templates/build"
	"github.com/cellfork/cellfork/internal/templates/layers"
)

// In a cluster one host builds a team's templates (the template host) and
// every host creates sandboxes from them. A build's artifact is what
// another host needs to start the template exactly as its builder did: the
// layers of its root file system (each packed into the chunk store; a base
// that is the built-in template's root stays a path every host has: the
// built-in template's cluster artifact, template.Artifacts) and
// its warm image, published under the team's names and tags before the
// build reports ready. A host asked for a template it does not have finds
// the artifact, pulls it (every chunk verified), assembles the same root
// and restores the same warm image.

// Shared is where the hosts of a cluster share built templates
// (Config.Shared; nil on a single host).
type Shared interface {
	// PutLayer stores what write writes (a packed layer) and returns the
	// root naming it in the chunk store.
	PutLayer(ctx context.Context, write func(io.Writer) error) (root string, err error)
	// GetLayer hands read what root names, verified.
	GetLayer(ctx context.Context, root string, read func(io.Reader) error) error
	// PutImage stores a warm image directory; GetImage rebuilds it into
	// dir (which must not exist).
	PutImage(ctx context.Context, dir string) (root string, err error)
	GetImage(ctx context.Context, root, dir string) error
	// Publish records a build's artifact, answering to its names and tags.
	Publish(ctx context.Context, a Artifact) error
	// Sync records which of a template's builds are ready, with their
	// tags, and its names; builds not in builds are forgotten (nil: the
	// template is gone).
	Sync(ctx context.Context, team, templateID string, names []string, builds map[string][]string) error
	// Find returns the artifact of the build ref ("name", "name:tag", a
	// template id) names for team: ErrNotFound if none,
	// ErrFailedPrecondition if this host cannot run it (another runsc
	// build).
	Find(ctx context.Context, team, ref string) (Artifact, error)
	// FindBuild returns the artifact of team's build id, as Find.
	FindBuild(ctx context.Context, team, id string) (Artifact, error)
}

// Artifact is a published build.
type Artifact struct {
	Team       string        `json:"team"`
	TemplateID string        `json:"templateID"`
	BuildID    string        `json:"buildID"`
	Names      []string      `json:"names"`
	Tags       []string      `json:"tags"`
	Layers     []SharedLayer `json:"layers"` // bottom first
	Image      string        `json:"image"`  // the warm image's root
	WarmKey    string        `json:"warmKey"`
	// Spec (no credentials), Context and Limits are what the warm image
	// was made with: a host checks its own warm key for them.
	Spec    build.Spec     `json:"spec"`
	Context build.Context  `json:"context"`
	Limits  sandbox.Limits `json:"limits"`
	// Runtime is the runsc build of the host that published it (set by
	// Shared).
	Runtime string `json:"runtime,omitempty"`
}

// SharedLayer is one layer of an artifact: Root names its packed files, or
// External the root file system it is (the built-in template's).
type SharedLayer struct {
	layers.Layer
	Root string `json:"root,omitempty"`
}

// Roots lists the chunk store roots an artifact keeps alive.
func (a Artifact) Roots() []string {
	out := []string{a.Image}
	for _, l := range a.Layers {
		if l.Root != "" {
			out = append(out, l.Root)
		}
	}
	return out
}

// publish puts a finished build's layers and warm image into the chunk
// store and records its artifact, before the build reports ready.
func (s *Service) publish(ctx context.Context, templateID, buildID string, spec build.Spec, limits sandbox.Limits, res *build.Result, logf func(build.Entry)) error {
	t0 := time.Now()
	s.mu.Lock()
	t := s.findLocked(context.Background(), templateID)
	var b *Build
	if t != nil {
		b = t.build(buildID)
	}
	if b == nil {
		s.mu.Unlock()
		return errdefs.New(errdefs.ErrNotFound, "template %s was deleted during its build", templateID)
	}
	a := Artifact{Team: t.Team, TemplateID: t.ID, BuildID: b.ID, Names: slices.Clone(t.Names), Tags: slices.Clone(b.Tags),
		WarmKey: res.WarmKey, Spec: specOf(b), Context: res.Context, Limits: limits}
	s.mu.Unlock()
	a.Spec.Registry = nil
	for _, id := range res.Layers {
		l, ok := s.cfg.Layers.Get(id)
		if !ok {
			return fmt.Errorf("layer %s of the build is gone", id)
		}
		sl := SharedLayer{Layer: *l}
		if l.External == "" {
			// Stored again each time: a root stored for an earlier build
			// may have been collected since (its template deleted); the
			// store skips the chunks it has.
			root, err := s.cfg.Shared.PutLayer(ctx, func(w io.Writer) error { return s.cfg.Layers.Pack(id, w) })
			if err != nil {
				return fmt.Errorf("storing layer %s (%s): %w", id, l.Step, err)
			}
			sl.Root = root
		}
		a.Layers = append(a.Layers, sl)
	}
	root, err := s.cfg.Shared.PutImage(ctx, res.Image)
	if err != nil {
		return fmt.Errorf("storing the warm image: %w", err)
	}
	a.Image = root
	if err := s.cfg.Shared.Publish(ctx, a); err != nil {
		return fmt.Errorf("recording the template in the cluster: %w", err)
	}
	logf(build.Entry{Level: "info", Step: build.StepFinalize,
		Message: fmt.Sprintf("Template published to the cluster's chunk store in %s", time.Since(t0).Round(time.Millisecond))})
	return nil
}

// syncShared records a template's ready builds, tags and names in the
// cluster (after a build, a tag change, a delete). One at a time, each from
// the records as they are then, so a later state is never overwritten by
// an earlier one.
func (s *Service) syncShared(team, templateID string) {
	if s.cfg.Shared == nil {
		return
	}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	var names []string
	var builds map[string][]string
	if t := s.findLocked(context.Background(), templateID); t != nil {
		names, builds = slices.Clone(t.Names), map[string][]string{}
		for _, b := range t.Builds {
			if b.Status == StatusReady && !b.Purged {
				builds[b.ID] = t.tagsOf(b.ID)
			}
		}
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.stopped, 30*time.Second)
	defer cancel()
	if err := s.cfg.Shared.Sync(ctx, team, templateID, names, builds); err != nil {
		s.log.Warn("recording a template's builds in the cluster", "template.id", templateID, "err", err)
	}
}

// resolveShared finds a template this host did not build in the cluster,
// and pulls its artifact the first time.
func (s *Service) resolveShared(ctx context.Context, id string) (Resolved, error) {
	team, _ := sandbox.TeamOf(ctx)
	a, err := s.cfg.Shared.Find(ctx, team, id)
	if err != nil {
		return Resolved{}, err
	}
	// One pull per build, whoever asks; it runs to its end even if the
	// first asker gives up.
	pctx := context.WithoutCancel(ctx)
	v, err, _ := s.pulls.Do(a.BuildID, func() (any, error) { return s.pull(pctx, a) })
	if err != nil {
		return Resolved{}, err
	}
	return v.(Resolved), nil
}

// LocalRoot returns this host's copy of the root file system rootfs, a
// path another host may have written (in a snapshot's or a paused
// sandbox's record that came through the cluster). A custom template
// build's root (DIR/builds/BUILD/rootfs where it was built,
// DIR/pulled/BUILD/rootfs where it was pulled, DIR being a host's
// custom-templates directory) is this host's root of the same build: its
// own, else the one it pulled, else pulled now for team. Any other path
// (a built-in template's, the same on every host) is returned as it is.
func (s *Service) LocalRoot(ctx context.Context, team, rootfs string) (string, error) {
	id, ok := buildOfRoot(rootfs)
	if !ok {
		return rootfs, nil
	}
	s.mu.Lock()
	for _, t := range s.st.Templates {
		if b := t.build(id); b != nil && t.Team == team && b.Status == StatusReady && !b.Purged {
			s.mu.Unlock()
			return b.Rootfs, nil
		}
	}
	s.mu.Unlock()
	dir := s.pulledDir(id)
	s.pulledMu.Lock()
	_, err := os.Stat(filepath.Join(dir, "artifact.json"))
	s.pulledMu.Unlock()
	if err == nil {
		return filepath.Join(dir, "rootfs"), nil
	}
	if s.cfg.Shared == nil {
		return "", errdefs.New(errdefs.ErrFailedPrecondition, "template build %s (root %s) is not on this host", id, rootfs)
	}
	a, err := s.cfg.Shared.FindBuild(ctx, team, id)
	if err != nil {
		return "", fmt.Errorf("finding template build %s in the cluster: %w", id, err)
	}
	pctx := context.WithoutCancel(ctx)
	v, err, _ := s.pulls.Do(a.BuildID, func() (any, error) { return s.pull(pctx, a) })
	if err != nil {
		return "", err
	}
	return v.(Resolved).Rootfs, nil
}

// buildOfRoot returns the build whose root rootfs is (on any host), if it
// is one: .../custom-templates/{builds,pulled}/BUILD/rootfs.
func buildOfRoot(rootfs string) (string, bool) {
	dir, name := filepath.Split(filepath.Clean(rootfs))
	if name != "rootfs" {
		return "", false
	}
	dir, id := filepath.Split(filepath.Clean(dir))
	dir, kind := filepath.Split(filepath.Clean(dir))
	if (kind != "builds" && kind != "pulled") || filepath.Base(dir) != "custom-templates" || !validBuildID(id) {
		return "", false
	}
	return id, true
}

func validBuildID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// pulledDir is where a pulled build's root and warm image live.
func (s *Service) pulledDir(buildID string) string {
	return filepath.Join(s.cfg.Dir, "pulled", buildID)
}

// pull assembles an artifact's root from its layers (fetching those this
// host lacks), adds this host's agent, imports the warm image, and keeps
// the template ready in the pool. Nothing is left of a pull that fails.
func (s *Service) pull(ctx context.Context, a Artifact) (Resolved, error) {
	dir := s.pulledDir(a.BuildID)
	r := Resolved{Key: a.BuildID, Rootfs: filepath.Join(dir, "rootfs"), Image: filepath.Join(dir, "image"), Limits: a.Limits}
	s.pulledMu.Lock()
	_, err := os.Stat(filepath.Join(dir, "artifact.json"))
	if err == nil {
		now := time.Now()
		_ = os.Chtimes(filepath.Join(dir, "artifact.json"), now, now) // its last use (collectPulled)
	}
	s.pulledMu.Unlock()
	if err == nil {
		return r, nil
	}
	key, err := s.cfg.Builder.WarmKey(a.Spec, a.Context, a.Limits)
	if err != nil {
		return Resolved{}, err
	}
	if key != a.WarmKey {
		return Resolved{}, errdefs.New(errdefs.ErrFailedPrecondition,
			"template %q was built by a host with another cellfork agent or boot configuration (warm image %s, this host's would be %s)", a.TemplateID, a.WarmKey, key)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return Resolved{}, err
	}
	tmp := dir + ".tmp-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return Resolved{}, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	var chain []string
	for _, l := range a.Layers {
		if l.External != "" {
			if _, err := os.Stat(l.External); err != nil {
				return Resolved{}, errdefs.New(errdefs.ErrFailedPrecondition,
					"template %q is built on the root file system %s, which is not on this host", a.TemplateID, l.External)
			}
			local, err := s.cfg.Layers.AddExternal(l.Key, l.External, l.Step, l.Meta)
			if err != nil {
				return Resolved{}, err
			}
			chain = append(chain, local.ID)
			continue
		}
		want := l.Layer
		if len(chain) > 0 {
			want.Parent = chain[len(chain)-1]
		}
		var got *layers.Layer
		err := s.cfg.Shared.GetLayer(ctx, l.Root, func(rd io.Reader) error {
			var err error
			got, err = s.cfg.Layers.Adopt(want, rd)
			return err
		})
		if err != nil {
			return Resolved{}, fmt.Errorf("fetching layer %s (%s) of template %q: %w", l.ID, l.Step, a.TemplateID, err)
		}
		chain = append(chain, got.ID)
	}
	if err := s.cfg.Layers.Flatten(chain, filepath.Join(tmp, "rootfs")); err != nil {
		return Resolved{}, fmt.Errorf("assembling template %q: %w", a.TemplateID, err)
	}
	if err := s.cfg.Builder.InstallAgent(filepath.Join(tmp, "rootfs")); err != nil {
		return Resolved{}, err
	}
	if err := s.cfg.Shared.GetImage(ctx, a.Image, filepath.Join(tmp, "image")); err != nil {
		return Resolved{}, fmt.Errorf("fetching the warm image of template %q: %w", a.TemplateID, err)
	}
	rec, err := json.Marshal(a)
	if err != nil {
		return Resolved{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "artifact.json"), rec, 0o600); err != nil {
		return Resolved{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "artifact.json")); serr == nil {
			return r, nil
		}
		return Resolved{}, err
	}
	ok = true
	s.log.Info("template pulled from the cluster", "template.id", a.TemplateID, "build.id", a.BuildID, "layers", len(chain))
	s.cfg.Pool.WarmCustom(r, s.cfg.PoolReady)
	return r, nil
}
