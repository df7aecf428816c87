package manager

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/runtime/fake"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/store"
)

// env is a Manager on a fake machine, with a real (SQLite) store.
type env struct {
	t   *testing.T
	h   *fake.Host
	st  *testStore
	dir string
	cfg Config
	m   *Manager
	// images, if set, is the manager's ImageStore (images_test.go);
	// shared, its cluster's other hosts' snapshots.
	images  *memImages
	cluster Cluster
}

// fakeTemplates has every built-in template built: an empty rootfs.
type fakeTemplates struct{ dir string }

func (f fakeTemplates) Rootfs(_ context.Context, name string, _ io.Writer) (string, error) {
	p := filepath.Join(f.dir, "templates", name, "rootfs")
	return p, os.MkdirAll(p, 0o755)
}

func (fakeTemplates) WarmKey(name, runtime, boot string) (string, error) { return "k1", nil }

var errInjected = errors.New("injected failure")

// testStore is the env's store, whose deletes and snapshot writes a test
// can make fail (a sandbox record's write has failpoint.StorePut).
type testStore struct {
	*store.Store
	mu   sync.Mutex
	fail map[string]error // guarded by mu: method name -> error
}

// Fail makes every call of the method op fail with err; nil clears it.
func (s *testStore) Fail(op string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail == nil {
		s.fail = map[string]error{}
	}
	s.fail[op] = err
}

func (s *testStore) failing(op string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fail[op]
}

func (s *testStore) Delete(ctx context.Context, id string) error {
	if err := s.failing("Delete"); err != nil {
		return err
	}
	return s.Store.Delete(ctx, id)
}

func (s *testStore) PutSnapshot(ctx context.Context, sn *sandbox.Snapshot) error {
	if err := s.failing("PutSnapshot"); err != nil {
		return err
	}
	return s.Store.PutSnapshot(ctx, sn)
}

func (s *testStore) DeleteSnapshot(ctx context.Context, id string) error {
	if err := s.failing("DeleteSnapshot"); err != nil {
		return err
	}
	return s.Store.DeleteSnapshot(ctx, id)
}

func testConfig(dir string) Config {
	lim := sandbox.Limits{CPUCount: 1, MemoryMB: 1024, DiskMB: 512, PidsMax: 512, OpenFiles: 65536}
	return Config{
		DataDir: dir, DefaultLimits: lim,
		MaxLimits:      sandbox.Limits{CPUCount: 2, MemoryMB: 4096, DiskMB: 2048, PidsMax: 4096, OpenFiles: 1 << 20},
		TemplateLimits: map[string]sandbox.Limits{"base": lim, "code-interpreter-v1": lim},
		DefaultTimeout: time.Minute, MaxTimeout: time.Hour, MaxUploadBytes: 1 << 20,
		StartConcurrency: 4, StartQueue: 64, StartWait: 10 * time.Second,
		MaxFork: 8, SpillAfter: time.Hour, AgentPath: "/opt/agent",
	}
}

// newEnv starts a Manager; change adjusts its configuration first.
func newEnv(t *testing.T, change func(*Config)) *env {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, h: fake.New(), st: &testStore{Store: st}, dir: dir, cfg: testConfig(dir)}
	if change != nil {
		change(&e.cfg)
	}
	e.start()
	t.Cleanup(func() {
		e.killAll()
		e.m.Close()
		st.Close()
		if leaks := e.h.Leaks(); len(leaks) > 0 {
			t.Errorf("left behind: %v", leaks)
		}
	})
	return e
}

// start makes a Manager over the env's machine and store, reconciles and
// starts it.
func (e *env) start() {
	e.t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	d := Deps{Runtime: e.h, Networks: e.h.Networks(), Agent: e.h.Agent(), Store: e.st,
		Templates: fakeTemplates{e.dir}, Log: log}
	if e.images != nil {
		d.Images = e.images
	}
	d.Cluster = e.cluster
	e.m = New(e.cfg, d)
	ctx := context.Background()
	if err := e.m.Reconcile(ctx); err != nil {
		e.t.Fatal(err)
	}
	if err := e.m.Start(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// restart closes the Manager (its sandboxes keep running) and starts a new
// one, as a daemon restart does.
func (e *env) restart() {
	e.t.Helper()
	e.m.Close()
	e.start()
}

func (e *env) killAll() {
	list, _ := e.m.List(context.Background())
	for _, sb := range list {
		_ = e.m.Kill(context.Background(), sb.ID)
	}
	snaps, _ := e.m.ListSnapshots(context.Background())
	for _, sn := range snaps {
		_ = e.m.DeleteSnapshot(context.Background(), sn.ID)
	}
}

func (e *env) create(req sandbox.CreateRequest) *sandbox.Sandbox {
	e.t.Helper()
	if req.TemplateID == "" {
		req.TemplateID = "base"
	}
	sb, err := e.m.Create(context.Background(), req)
	if err != nil {
		e.t.Fatalf("create: %v", err)
	}
	return sb
}

// write sets the memory of sandbox id's box (code ran in it).
func (e *env) write(id, memory string) {
	e.t.Helper()
	sb, err := e.m.Get(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.h.Write(sb.RuntimeID, memory); err != nil {
		e.t.Fatal(err)
	}
}

// memory returns the memory of sandbox id's box.
func (e *env) memory(id string) string {
	e.t.Helper()
	sb, err := e.m.Get(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.h.Memory(sb.RuntimeID)
}

// runtimes counts the machine's runtimes.
func (e *env) runtimes() int {
	ids, _ := e.h.List(context.Background())
	return len(ids)
}

// settle waits until the pool is idle (its refills and deferred destroys
// done), so runtime counts are stable.
func (e *env) settle() {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		before := e.runtimes()
		time.Sleep(400 * time.Millisecond) // past pool.IdleGrace
		if e.runtimes() == before && e.m.adm.Idle() {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatal("the pool did not settle")
		}
	}
}
