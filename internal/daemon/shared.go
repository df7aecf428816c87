package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/clusterhost"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/snapshots"
	"github.com/cellfork/cellfork/internal/template"
	"github.com/cellfork/cellfork/internal/templates"
	"github.com/cellfork/cellfork/internal/templates/layers"
)

// sharedTemplates is templates.Shared for a cluster host: artifacts in the
// chunk store, their records in the cluster's database.
type sharedTemplates struct {
	member *clusterhost.Member
	images snapshots.ImageStore
	tmp    string // scratch space for packed layers
}

const layerFile = "layer.tar"

func (s sharedTemplates) PutLayer(ctx context.Context, write func(io.Writer) error) (string, error) {
	dir, err := os.MkdirTemp(s.tmp, "layer-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	f, err := os.Create(filepath.Join(dir, layerFile))
	if err != nil {
		return "", err
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	root, _, err := s.images.Export(ctx, dir, map[string]string{"kind": "template-layer"})
	return root, err
}

func (s sharedTemplates) GetLayer(ctx context.Context, root string, read func(io.Reader) error) error {
	base, err := os.MkdirTemp(s.tmp, "layer-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	dir := filepath.Join(base, "x")
	if _, err := s.images.Import(ctx, root, dir); err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(dir, layerFile))
	if err != nil {
		return errdefs.New(errdefs.ErrCorrupt, "template layer %s holds no %s", root, layerFile)
	}
	defer f.Close()
	return read(f)
}

func (s sharedTemplates) PutImage(ctx context.Context, dir string) (string, error) {
	// A chunk store exports it as a base: the snapshots and paused
	// sandboxes of the template are written over it.
	if c, ok := s.images.(chunkImages); ok {
		return c.exportBase(ctx, dir, "template-image")
	}
	root, _, err := s.images.Export(ctx, dir, map[string]string{"kind": "template-image"})
	return root, err
}

func (s sharedTemplates) GetImage(ctx context.Context, root, dir string) error {
	_, err := s.images.Import(ctx, root, dir)
	return err
}

func (s sharedTemplates) Publish(ctx context.Context, a templates.Artifact) error {
	doc, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return s.member.PublishTemplate(ctx, clusterdb.TemplateBuild{BuildID: a.BuildID, Team: a.Team, TemplateID: a.TemplateID,
		Names: a.Names, Tags: a.Tags, Roots: a.Roots(), Artifact: doc})
}

func (s sharedTemplates) Sync(ctx context.Context, team, templateID string, names []string, builds map[string][]string) error {
	return s.member.SyncTemplate(ctx, team, templateID, names, builds)
}

func (s sharedTemplates) Find(ctx context.Context, team, ref string) (templates.Artifact, error) {
	name, tag := templates.SplitName(ref)
	b, err := s.member.FindTemplate(ctx, team, name, tag)
	if err != nil {
		return templates.Artifact{}, err
	}
	return artifactOf(b, ref)
}

func (s sharedTemplates) FindBuild(ctx context.Context, team, id string) (templates.Artifact, error) {
	b, err := s.member.FindTemplateBuild(ctx, team, id)
	if err != nil {
		return templates.Artifact{}, err
	}
	return artifactOf(b, id)
}

// artifactOf reads the artifact of build row b, which ref named.
func artifactOf(b clusterdb.TemplateBuild, ref string) (templates.Artifact, error) {
	var a templates.Artifact
	if err := json.Unmarshal(b.Artifact, &a); err != nil || a.BuildID != b.BuildID {
		return a, errors.Join(errdefs.New(errdefs.ErrFailedPrecondition, "template %q: its record in the cluster cannot be read (another cellfork version?)", ref), err)
	}
	a.Runtime = b.Runtime
	return a, nil
}

// builtinArtifacts is template.Artifacts for a cluster host: the built-in
// templates' root file systems packed into the chunk store (as a custom
// template's layers are), their roots in the cluster's database (db; nil
// when it did not answer, for dbErr).
type builtinArtifacts struct {
	db     *clusterdb.DB
	dbErr  error
	layers sharedTemplates // its layer methods, which need no member
}

func (b builtinArtifacts) Find(ctx context.Context, name, definition string) (string, error) {
	if b.db == nil {
		return "", errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable: %v", b.dbErr)
	}
	return b.db.BuiltinRoot(ctx, name, definition)
}

func (b builtinArtifacts) Publish(ctx context.Context, name, definition, rootfs string) (string, error) {
	if b.db == nil {
		return "", errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable: %v", b.dbErr)
	}
	agent := strings.TrimPrefix(template.AgentDir, "/")
	root, err := b.layers.PutLayer(ctx, func(w io.Writer) error {
		return layers.PackDir(rootfs, w, func(rel string) bool { return rel == agent })
	})
	if err != nil {
		return "", err
	}
	return b.db.PublishBuiltin(ctx, name, definition, root)
}

func (b builtinArtifacts) Pull(ctx context.Context, root, dir string) error {
	return b.layers.GetLayer(ctx, root, func(r io.Reader) error { return layers.Unpack(r, dir) })
}
