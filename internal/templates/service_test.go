package templates

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/templates/build"
	"github.com/cellfork/cellfork/internal/templates/layers"
)

// fakeBuilder "builds" by writing the result directories; a step whose
// command is "fail" fails, "block" waits until the build is cancelled.
type fakeBuilder struct {
	mu     sync.Mutex
	builds int
	warm   string        // WarmKey it answers
	layers *layers.Store // set: each build makes a layer of its steps' "echo" output
}

func (f *fakeBuilder) Build(ctx context.Context, job build.Job) (*build.Result, error) {
	f.mu.Lock()
	f.builds++
	f.mu.Unlock()
	job.Log(build.Entry{Level: "info", Step: "base", Message: "FROM " + job.Spec.FromImage})
	for i, st := range job.Spec.Steps {
		job.Log(build.Entry{Level: "info", Step: "1", Message: st.String()})
		switch st.Args[0] {
		case "fail":
			return nil, &build.StepError{Step: "1", Err: errors.New("failed to run command 'fail': exit status 1")}
		case "block":
			<-ctx.Done()
			return nil, &build.StepError{Step: "1", Err: ctx.Err()}
		}
		_ = i
	}
	var chain []string
	if f.layers != nil {
		p, err := f.layers.Begin(layers.Key(job.Dir), "")
		if err != nil {
			return nil, err
		}
		for _, st := range job.Spec.Steps {
			if out, ok := strings.CutPrefix(st.Args[0], "echo "); ok {
				os.WriteFile(filepath.Join(p.Diff(), "step.txt"), []byte(out), 0o644)
			}
		}
		l, err := p.Commit("RUN", nil)
		if err != nil {
			return nil, err
		}
		chain = []string{l.ID}
	}
	rootfs := filepath.Join(job.Dir, "rootfs")
	image := filepath.Join(job.Dir, "warm-k")
	for _, d := range []string{rootfs, image} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	os.WriteFile(filepath.Join(image, "checkpoint.img"), []byte("x"), 0o600)
	return &build.Result{Layers: chain, Rootfs: rootfs, Image: image, WarmKey: f.key(), Context: build.Context{User: "user"}}, nil
}

func (f *fakeBuilder) key() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.warm == "" {
		return "k"
	}
	return f.warm
}

func (f *fakeBuilder) WarmKey(build.Spec, build.Context, sandbox.Limits) (string, error) {
	return f.key(), nil
}
func (f *fakeBuilder) Warm(_ context.Context, _ string, _ build.Spec, _ build.Context, _ sandbox.Limits, image string, _ func(build.Entry)) error {
	os.MkdirAll(image, 0o700)
	return os.WriteFile(filepath.Join(image, "checkpoint.img"), []byte("y"), 0o600)
}
func (f *fakeBuilder) InstallAgent(string) error       { return nil }
func (f *fakeBuilder) AgentLayerName() (string, error) { return "agent-x", nil }

type fakePool struct {
	mu    sync.Mutex
	warm  map[string]Resolved
	inUse map[string]bool
}

func (p *fakePool) WarmCustom(r Resolved, _ int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.warm[r.Key] = r
}
func (p *fakePool) UnwarmCustom(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.warm, key)
}
func (p *fakePool) use(rootfs string, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inUse[rootfs] = on
}

func (p *fakePool) RootfsInUse(context.Context) (map[string]bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]bool{}
	for k, v := range p.inUse {
		out[k] = v
	}
	return out, nil
}

func newService(t *testing.T, dir string, mutate func(*Config)) (*Service, *fakeBuilder, *fakePool) {
	t.Helper()
	ls, err := layers.Open(filepath.Join(dir, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	fb := &fakeBuilder{}
	fp := &fakePool{warm: map[string]Resolved{}, inUse: map[string]bool{}}
	cfg := Config{Dir: dir, Builder: fb, Layers: ls, Pool: fp,
		Defaults:  sandbox.Limits{CPUCount: 1, MemoryMB: 1024, DiskMB: 512, PidsMax: 512, OpenFiles: 1024},
		MaxLimits: sandbox.Limits{CPUCount: 2, MemoryMB: 4096, DiskMB: 2048, PidsMax: 4096, OpenFiles: 1 << 20},
		Reserved:  []string{"base"}, MaxUploadBytes: 1 << 20, PoolReady: 1}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Close)
	return s, fb, fp
}

// wait polls a build until it is no longer building.
func wait(t *testing.T, s *Service, id, buildID string) *BuildInfo {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := s.BuildStatus(context.Background(), id, buildID, 0, 100, "")
		if err != nil {
			t.Fatal(err)
		}
		if info.Build.Status != StatusBuilding {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatal("build did not finish")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func buildOnce(t *testing.T, s *Service, name string, steps ...string) (*Template, *Build, *BuildInfo) {
	t.Helper()
	tp, b, err := s.Create(context.Background(), CreateRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	sp := build.Spec{FromImage: "x"}
	for _, c := range steps {
		sp.Steps = append(sp.Steps, build.Step{Type: "RUN", Args: []string{c}})
	}
	if err := s.StartBuild(context.Background(), tp.ID, b.ID, sp); err != nil {
		t.Fatal(err)
	}
	return tp, b, wait(t, s, tp.ID, b.ID)
}

func TestCreateBuildResolve(t *testing.T) {
	s, _, fp := newService(t, t.TempDir(), nil)
	tp, b, info := buildOnce(t, s, "web:v1", "echo")
	if info.Build.Status != StatusReady || info.TemplateID != tp.ID || len(info.Logs) != 2 {
		t.Fatalf("status %+v logs %v", info.Build, info.Logs)
	}
	if b.Tags[0] != "v1" {
		t.Errorf("tags %v, want [v1]", b.Tags)
	}
	for _, id := range []string{"web", "web:v1", tp.ID, tp.ID + ":v1"} {
		r, err := s.ResolveTemplate(context.Background(), id)
		if err != nil || r.Key != b.ID {
			t.Errorf("resolve %q = %+v, %v", id, r, err)
		}
	}
	if _, err := s.ResolveTemplate(context.Background(), "web:nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown tag: %v", err)
	}
	if _, ok := fp.warm[b.ID]; !ok {
		t.Error("the ready build was not handed to the pool")
	}
	// Paging of the log.
	page, _ := s.BuildStatus(context.Background(), tp.ID, b.ID, 1, 1, "")
	if len(page.Logs) != 1 || page.Logs[0].Message != "RUN echo" {
		t.Errorf("page = %+v", page.Logs)
	}
	// A rebuild under a second tag replaces the pool's build.
	_, b2, _ := buildOnce(t, s, "web:v2", "echo")
	if _, ok := fp.warm[b.ID]; ok {
		t.Error("the old build stayed in the pool")
	}
	if r, _ := s.ResolveTemplate(context.Background(), "web"); r.Key != b2.ID {
		t.Error("web does not name the newest build")
	}
	if r, _ := s.ResolveTemplate(context.Background(), "web:v1"); r.Key != b.ID {
		t.Error("web:v1 no longer names its build")
	}
	// Tags.
	if id, err := s.AssignTags(context.Background(), "web:v1", []string{"prod"}); err != nil || id != b.ID {
		t.Errorf("assign = %s, %v", id, err)
	}
	for _, bad := range []string{":x", "x:", "a b"} {
		if _, err := s.AssignTags(context.Background(), "web:v1", []string{bad}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("tag %q: %v", bad, err)
		}
	}
	if err := s.RemoveTags(context.Background(), "web", []string{"prod"}); err != nil {
		t.Error(err)
	}
	if err := s.RemoveTags(context.Background(), "web", []string{"prod"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("removing a missing tag: %v", err)
	}
}

func TestBuildErrors(t *testing.T) {
	s, _, _ := newService(t, t.TempDir(), nil)
	tp, b, info := buildOnce(t, s, "bad", "fail")
	if info.Build.Status != StatusError || info.Build.Reason == nil || info.Build.Reason.Step != "1" ||
		!strings.Contains(info.Build.Reason.Message, "failed to run command 'fail'") {
		t.Fatalf("failed build: %+v", info.Build)
	}
	if ents, _ := os.ReadDir(s.buildDir(b.ID)); len(ents) != 1 {
		t.Errorf("a failed build left %v (only its log should stay)", ents)
	}
	if _, err := s.ResolveTemplate(context.Background(), "bad"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("resolving a template without a ready build: %v", err)
	}
	if err := s.StartBuild(context.Background(), tp.ID, b.ID, build.Spec{FromImage: "x"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("starting a finished build again: %v", err)
	}
	for name, req := range map[string]CreateRequest{
		"reserved": {Name: "base"}, "upper case": {Name: "Web"}, "bad tag": {Name: "x:a:b"},
		"cpu": {Name: "x", CPUCount: 9}, "memory": {Name: "x", MemoryMB: 1},
	} {
		if _, _, err := s.Create(context.Background(), req); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := s.StartBuild(context.Background(), tp.ID, "nope", build.Spec{FromImage: "x"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown build: %v", err)
	}
	_, b3, _ := s.Create(context.Background(), CreateRequest{Name: "self"})
	if err := s.StartBuild(context.Background(), "self", b3.ID, build.Spec{FromTemplate: "self"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("from itself: %v", err)
	}
}

// A build that was asked for and never started (the client gave up
// before starting it) is failed by the next request for one of its tags,
// as E2B does; other tags' waiting builds stay startable.
func TestNewBuildSupersedesUnstarted(t *testing.T) {
	s, _, _ := newService(t, t.TempDir(), nil)
	_, abandoned, _ := s.Create(context.Background(), CreateRequest{Name: "app"})
	_, other, _ := s.Create(context.Background(), CreateRequest{Name: "app:v2"})
	tp, b, info := buildOnce(t, s, "app", "echo")
	if info.Build.Status != StatusReady {
		t.Fatalf("the new build: %+v", info.Build)
	}
	old, err := s.BuildStatus(context.Background(), tp.ID, abandoned.ID, 0, 0, "")
	if err != nil || old.Build.Status != StatusError || old.Build.Reason == nil ||
		old.Build.Reason.Message != "The build was canceled because it was superseded by a newer one." || old.Build.FinishedAt == nil {
		t.Errorf("the abandoned build: %+v, %v", old, err)
	}
	if err := s.StartBuild(context.Background(), tp.ID, abandoned.ID, build.Spec{FromImage: "x"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("starting a superseded build: %v", err)
	}
	if v2, _ := s.BuildStatus(context.Background(), tp.ID, other.ID, 0, 0, ""); v2.Build.Status != StatusWaiting {
		t.Errorf("a waiting build of another tag became %s", v2.Build.Status)
	}
	if cur, _ := s.BuildStatus(context.Background(), tp.ID, b.ID, 0, 0, ""); cur.Build.Status != StatusReady {
		t.Errorf("the new build became %s", cur.Build.Status)
	}
}

func TestQueueAndTimeout(t *testing.T) {
	s, _, _ := newService(t, t.TempDir(), func(c *Config) { c.Queue = 1; c.Timeout = 300 * time.Millisecond })
	var ids [3][2]string
	for i := range 3 {
		tp, b, _ := s.Create(context.Background(), CreateRequest{Name: "q"})
		ids[i] = [2]string{tp.ID, b.ID}
		err := s.StartBuild(context.Background(), tp.ID, b.ID, build.Spec{FromImage: "x", Steps: []build.Step{{Type: "RUN", Args: []string{"block"}}}})
		if i < 2 && err != nil {
			t.Fatal(err)
		}
		if i == 2 && !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("third build with one slot and a queue of one: %v, want unavailable", err)
		}
	}
	info := wait(t, s, ids[0][0], ids[0][1])
	if info.Build.Status != StatusError || !strings.Contains(info.Build.Reason.Message, "longer than the limit") {
		t.Errorf("runaway build: %+v", info.Build.Reason)
	}
	wait(t, s, ids[1][0], ids[1][1])
}

func TestDeleteAndCollect(t *testing.T) {
	dir := t.TempDir()
	s, _, fp := newService(t, dir, nil)
	tp, b, _ := buildOnce(t, s, "gone", "echo")
	_, b2, _ := buildOnce(t, s, "gone", "echo") // supersedes b (untagged "default" moved)
	fp.use(filepath.Join(s.buildDir(b2.ID), "rootfs"), true)
	s.collect(context.Background())
	if _, err := os.Stat(filepath.Join(s.buildDir(b.ID), "rootfs")); err == nil {
		t.Error("a superseded, unused build kept its root")
	}
	if err := s.Delete(context.Background(), tp.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), "gone"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleted template: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.buildDir(b2.ID), "rootfs")); err != nil {
		t.Error("a root a sandbox runs on was removed")
	}
	fp.use(filepath.Join(s.buildDir(b2.ID), "rootfs"), false)
	s.collect(context.Background())
	if _, err := os.Stat(s.buildDir(b2.ID)); err == nil {
		t.Error("the deleted template's build stayed after its last sandbox")
	}
	if len(fp.warm) != 0 {
		t.Errorf("pool still warms %v", fp.warm)
	}
}

func TestRestart(t *testing.T) {
	dir := t.TempDir()
	s, fb, _ := newService(t, dir, nil)
	tp, b, _ := buildOnce(t, s, "keep", "echo")
	_, b2, _ := s.Create(context.Background(), CreateRequest{Name: "keep"})
	s.StartBuild(context.Background(), tp.ID, b2.ID, build.Spec{FromImage: "x", Steps: []build.Step{{Type: "RUN", Args: []string{"block"}}}})
	// A crash mid-build: the records say building (Close would record
	// the cancellation; the records from before it are put back).
	crashed, err := os.ReadFile(filepath.Join(dir, "templates.json"))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	os.WriteFile(filepath.Join(dir, "templates.json"), crashed, 0o600)
	fb.warm = "newkey" // another agent: the warm image is remade
	s2, _, fp2 := newService(t, dir, func(c *Config) { c.Builder = fb })
	info, _ := s2.BuildStatus(context.Background(), "keep", b2.ID, 0, 10, "")
	if info.Build.Status != StatusError || !strings.Contains(info.Build.Reason.Message, "daemon stopped") {
		t.Errorf("interrupted build after restart: %+v", info.Build)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := s2.Get(context.Background(), "keep")
		if got.latestReady().WarmKey == "newkey" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the warm image was not remade for the new agent")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, ok := fp2.warm[b.ID]; !ok {
		t.Error("after restart the ready build is not in the pool")
	}
}

// A crash between a collection's rename aside and its removal leaves
// *.gone-* entries; the next start removes them and nothing else.
func TestRestartRemovesGone(t *testing.T) {
	dir := t.TempDir()
	s, _, _ := newService(t, dir, nil)
	_, b, _ := buildOnce(t, s, "keep", "echo")
	s.Close()
	bd := s.buildDir(b.ID)
	left := []string{
		filepath.Join(bd, "rootfs.gone-abc123", "etc"),
		filepath.Join(dir, "builds", "b0000.gone-def456", "rootfs"),
	}
	for _, d := range left {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	newService(t, dir, nil)
	for _, d := range left {
		if _, err := os.Stat(filepath.Dir(d)); err == nil {
			t.Errorf("%s stayed after a restart", filepath.Dir(d))
		}
	}
	for _, p := range []string{filepath.Join(bd, "rootfs"), filepath.Join(bd, "log.jsonl")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the start removed a kept build's %s: %v", filepath.Base(p), err)
		}
	}
}

func TestUploads(t *testing.T) {
	s, _, _ := newService(t, t.TempDir(), nil)
	tp, _, _ := s.Create(context.Background(), CreateRequest{Name: "up"})
	h := strings.Repeat("ab", 32)
	if ok, err := s.FilePresent(context.Background(), tp.ID, h); ok || err != nil {
		t.Fatalf("present before upload: %v %v", ok, err)
	}
	if err := s.PutFile(context.Background(), tp.ID, h, strings.NewReader("data")); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.FilePresent(context.Background(), "up", h); !ok {
		t.Error("not present after upload")
	}
	if err := s.PutFile(context.Background(), tp.ID, h, strings.NewReader(strings.Repeat("x", 2<<20))); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("upload over the limit: %v", err)
	}
	if _, err := s.FilePresent(context.Background(), tp.ID, "../../etc/passwd"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad hash: %v", err)
	}
	if _, err := s.FilePresent(context.Background(), "nope", h); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown template: %v", err)
	}
}
