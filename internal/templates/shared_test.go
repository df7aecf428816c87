package templates

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/templates/build"
)

// fakeShared is a cluster's shared store in memory: blobs by root, rows by
// build id. Its conformance with the real one (chunk store, PostgreSQL) is
// the cluster test templates-travel.
type fakeShared struct {
	mu    sync.Mutex
	blobs map[string][]byte
	rows  map[string]Artifact
	n     int
}

func newFakeShared() *fakeShared {
	return &fakeShared{blobs: map[string][]byte{}, rows: map[string]Artifact{}}
}

func (f *fakeShared) put(b []byte) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	root := "root" + string(rune('a'+f.n))
	f.blobs[root] = b
	return root
}

func (f *fakeShared) PutLayer(_ context.Context, write func(io.Writer) error) (string, error) {
	var buf bytes.Buffer
	if err := write(&buf); err != nil {
		return "", err
	}
	return f.put(buf.Bytes()), nil
}

func (f *fakeShared) GetLayer(_ context.Context, root string, read func(io.Reader) error) error {
	f.mu.Lock()
	b, ok := f.blobs[root]
	f.mu.Unlock()
	if !ok {
		return errdefs.New(errdefs.ErrNotFound, "no %s", root)
	}
	return read(bytes.NewReader(b))
}

func (f *fakeShared) PutImage(_ context.Context, dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "checkpoint.img"))
	if err != nil {
		return "", err
	}
	return f.put(b), nil
}

func (f *fakeShared) GetImage(_ context.Context, root, dir string) error {
	f.mu.Lock()
	b, ok := f.blobs[root]
	f.mu.Unlock()
	if !ok {
		return errdefs.New(errdefs.ErrNotFound, "no %s", root)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "checkpoint.img"), b, 0o600)
}

func (f *fakeShared) Publish(_ context.Context, a Artifact) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rows[a.BuildID] = a
	return nil
}

func (f *fakeShared) Sync(_ context.Context, team, templateID string, names []string, builds map[string][]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, a := range f.rows {
		if a.Team != team || a.TemplateID != templateID {
			continue
		}
		tags, keep := builds[id]
		if !keep {
			delete(f.rows, id)
			continue
		}
		if tags != nil {
			a.Names, a.Tags = names, tags
			f.rows[id] = a
		}
	}
	return nil
}

func (f *fakeShared) row(id string) (Artifact, bool, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.rows[id]
	return a, ok, len(f.rows)
}

func (f *fakeShared) Find(_ context.Context, team, ref string) (Artifact, error) {
	name, tag := SplitName(ref)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.rows { // one build per template in these tests
		if a.Team == team && (a.TemplateID == name || slices.Contains(a.Names, name)) && (tag == "" || slices.Contains(a.Tags, tag)) {
			return a, nil
		}
	}
	return Artifact{}, errdefs.New(errdefs.ErrNotFound, "template %q not found", ref)
}

func (f *fakeShared) FindBuild(_ context.Context, team, id string) (Artifact, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.rows {
		if a.Team == team && a.BuildID == id {
			return a, nil
		}
	}
	return Artifact{}, errdefs.New(errdefs.ErrNotFound, "template build %q not found", id)
}

// TestSharedTemplates: a template built on one host (for team acme) is
// published with its layer and warm image before it reports ready;
// another host resolves it by name, name:tag and id for acme only,
// pulling and assembling it once; tags move and a delete forgets it; a
// host whose warm key differs refuses it.
func TestSharedTemplates(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("layers keep owners: needs root") // make test runs as root
	}
	shared := newFakeShared()
	builder, fb, _ := newService(t, t.TempDir(), func(c *Config) { c.Shared = shared })
	fb.layers = builder.cfg.Layers
	host, _, hostPool := newService(t, t.TempDir(), func(c *Config) { c.Shared = shared })
	acme := sandbox.WithTeam(context.Background(), "acme")
	other := sandbox.WithTeam(context.Background(), "other")

	tpl, b, err := builder.Create(acme, CreateRequest{Name: "web:v1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := builder.StartBuild(acme, tpl.ID, b.ID, build.Spec{FromTemplate: "base", Steps: []build.Step{{Type: "RUN", Args: []string{"echo hi"}}}, StartCmd: "serve"}); err != nil {
		t.Fatal(err)
	}
	if info := wait(t, builder, tpl.ID, b.ID); info.Build.Status != StatusReady {
		t.Fatalf("build: %+v", info.Build)
	}
	a, ok, _ := shared.row(b.ID)
	if !ok || a.Team != "acme" || a.Image == "" || len(a.Layers) != 1 || a.Layers[0].Root == "" || a.Spec.StartCmd != "serve" {
		t.Fatalf("published artifact %+v", a)
	}
	if _, err := builder.Get(other, "web"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another team sees the template: %v", err)
	}
	if l := builder.List(other); len(l) != 0 {
		t.Errorf("another team lists %d templates", len(l))
	}

	for _, ref := range []string{"web", "web:v1", tpl.ID} {
		r, err := host.ResolveTemplate(acme, ref)
		if err != nil {
			t.Fatalf("resolving %s on another host: %v", ref, err)
		}
		if r.Key != b.ID || !strings.HasPrefix(r.Rootfs, host.cfg.Dir) {
			t.Errorf("resolved %s to %+v", ref, r)
		}
		if got, err := os.ReadFile(filepath.Join(r.Rootfs, "step.txt")); err != nil || string(got) != "hi" {
			t.Errorf("the pulled root: %q %v", got, err)
		}
		if got, _ := os.ReadFile(filepath.Join(r.Image, "checkpoint.img")); string(got) != "x" {
			t.Errorf("the pulled warm image: %q", got)
		}
	}
	hostPool.mu.Lock()
	_, warm := hostPool.warm[b.ID]
	hostPool.mu.Unlock()
	if !warm {
		t.Error("the pulled template is not kept warm")
	}
	if _, err := host.ResolveTemplate(other, "web"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another team resolved the template on another host: %v", err)
	}

	if _, err := builder.AssignTags(acme, "web:v1", []string{"prod"}); err != nil {
		t.Fatal(err)
	}
	if err := builder.RemoveTags(acme, "web", []string{"v1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := host.ResolveTemplate(acme, "web:prod"); err != nil {
		t.Errorf("a moved tag: %v", err)
	}
	if _, err := host.ResolveTemplate(acme, "web:v1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a removed tag still resolves: %v", err)
	}

	// A host with another agent or boot configuration refuses it.
	odd, ofb, _ := newService(t, t.TempDir(), func(c *Config) { c.Shared = shared })
	ofb.warm = "other-key"
	if _, err := odd.ResolveTemplate(acme, "web"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a host with another warm key: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(odd.cfg.Dir, "pulled")); len(ents) != 0 {
		t.Errorf("a refused pull left %d entries", len(ents))
	}

	// Unused past the TTL and with nothing running on it, a pulled build
	// goes; in use, it stays.
	pulled := host.pulledDir(b.ID)
	hostPool.use(filepath.Join(pulled, "rootfs"), true)
	old := time.Now().Add(-2 * host.cfg.LayerTTL)
	os.Chtimes(filepath.Join(pulled, "artifact.json"), old, old)
	host.collectPulled(context.Background(), host.cfg.LayerTTL)
	if _, err := os.Stat(pulled); err != nil {
		t.Fatalf("a pulled build in use was removed: %v", err)
	}
	hostPool.use(filepath.Join(pulled, "rootfs"), false)
	host.collectPulled(context.Background(), host.cfg.LayerTTL)
	if _, err := os.Stat(pulled); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an unused pulled build stays: %v", err)
	}
	if _, err := host.ResolveTemplate(acme, "web"); err != nil {
		t.Fatalf("pulling it again: %v", err)
	}

	if err := builder.Delete(acme, "web"); err != nil {
		t.Fatal(err)
	}
	if _, _, n := shared.row(b.ID); n != 0 {
		t.Errorf("a deleted template's builds stay published: %d", n)
	}
	if _, err := host.ResolveTemplate(acme, "web"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a deleted template resolves: %v", err)
	}
}

// TestLocalRoot: a record from another host names its custom template's
// root by that host's path (where it was built, or pulled); each host maps
// it to its own copy of the same build, pulling it (for the record's team
// only) when it has none. Other paths stay as they are.
func TestLocalRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("layers keep owners: needs root") // make test runs as root
	}
	shared := newFakeShared()
	dir := func() string { return filepath.Join(t.TempDir(), "custom-templates") }
	builder, fb, _ := newService(t, dir(), func(c *Config) { c.Shared = shared })
	fb.layers = builder.cfg.Layers
	puller, _, _ := newService(t, dir(), func(c *Config) { c.Shared = shared })
	third, _, _ := newService(t, dir(), func(c *Config) { c.Shared = shared })
	acme := sandbox.WithTeam(context.Background(), "acme")
	tpl, b, err := builder.Create(acme, CreateRequest{Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if err := builder.StartBuild(acme, tpl.ID, b.ID, build.Spec{FromTemplate: "base", Steps: []build.Step{{Type: "RUN", Args: []string{"echo hi"}}}}); err != nil {
		t.Fatal(err)
	}
	if info := wait(t, builder, tpl.ID, b.ID); info.Build.Status != StatusReady {
		t.Fatalf("build: %+v", info.Build)
	}
	built := filepath.Join(builder.cfg.Dir, "builds", b.ID, "rootfs")
	r, err := puller.ResolveTemplate(acme, "web")
	if err != nil {
		t.Fatal(err)
	}
	pulled := filepath.Join(puller.cfg.Dir, "pulled", b.ID, "rootfs")
	if r.Rootfs != pulled {
		t.Fatalf("pulled to %s", r.Rootfs)
	}
	for _, c := range []struct {
		host       *Service
		from, want string
	}{
		{builder, pulled, built}, // a puller's record on the builder
		{puller, built, pulled},  // the builder's on a puller
		{puller, pulled, pulled}, // its own
		{builder, "/var/lib/cellfork/templates/base/1234/rootfs", "/var/lib/cellfork/templates/base/1234/rootfs"},
	} {
		if got, err := c.host.LocalRoot(acme, "acme", c.from); err != nil || got != c.want {
			t.Errorf("LocalRoot(%s) on %s: %q %v, want %q", c.from, c.host.cfg.Dir, got, err, c.want)
		}
	}
	// A host without the build pulls it, for its team only.
	if _, err := third.LocalRoot(acme, "other", built); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another team's record pulled the build: %v", err)
	}
	got, err := third.LocalRoot(acme, "acme", pulled)
	if err != nil || got != filepath.Join(third.cfg.Dir, "pulled", b.ID, "rootfs") {
		t.Fatalf("LocalRoot on a host without the build: %q %v", got, err)
	}
	if step, err := os.ReadFile(filepath.Join(got, "step.txt")); err != nil || string(step) != "hi" {
		t.Errorf("the root it pulled: %q %v", step, err)
	}
	for _, p := range []string{"/x/custom-templates/builds/../rootfs", "/x/other/builds/" + b.ID + "/rootfs", "/x/custom-templates/layers/" + b.ID + "/rootfs"} {
		if _, ok := buildOfRoot(p); ok {
			t.Errorf("%s taken for a build's root", p)
		}
	}
}
