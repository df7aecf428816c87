package clusterhost

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/clusterdb/pgtest"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/store"
)

var server *pgtest.Server

func TestMain(m *testing.M) { pgtest.Main(m, &server) }

// host is a daemon as the member sees it. held stands for a sandbox's op,
// which the manager's Drop and Published take.
type host struct {
	held   sync.Mutex
	events chan string
}

func (h *host) Usage() (int, int64, int)         { return 0, 0, 0 }
func (h *host) PoolStats() sandbox.PoolStats     { return sandbox.PoolStats{} }
func (h *host) RecheckRoots(ctx context.Context) {}

func (h *host) Drop(ctx context.Context, id, why string) {
	h.held.Lock()
	defer h.held.Unlock()
	h.events <- "drop " + id
}

func (h *host) Published(ctx context.Context, id, root string) {
	h.held.Lock()
	defer h.held.Unlock()
	h.events <- "published " + id + " " + root
}

// join makes a host of a fresh cluster database and waits until its
// syncs reach the database (a Put then writes its row before it returns).
func join(t *testing.T) (*Member, sandbox.Store, *host, *clusterdb.DB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	url := server.Database(t)
	db, err := clusterdb.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := db.PutRegion(ctx, clusterdb.Region{ID: 1, Name: "eu"}); err != nil {
		t.Fatal(err)
	}
	if err := db.PutTeam(ctx, clusterdb.Team{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m, err := Join(ctx, Config{URL: url, Region: "eu", Advertise: "127.0.0.1:9", DataDir: dir, Runtime: "test", Heartbeat: time.Hour}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	local, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { local.Close() })
	st := m.Store(local)
	h := &host{events: make(chan string, 16)}
	m.Start(ctx, h)
	for deadline := time.Now().Add(10 * time.Second); !m.healthy.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the member's first sync did not reach the database")
		}
	}
	return m, st, h, db
}

// put writes rec through the member's store while the sandbox is held
// (as the manager's operations hold it while they write its record),
// and fails the test if the write waits for what it asks the host to do.
func put(t *testing.T, st sandbox.Store, h *host, rec *sandbox.Sandbox) error {
	t.Helper()
	h.held.Lock()
	defer h.held.Unlock()
	done := make(chan error, 1)
	go func() { done <- st.Put(context.Background(), rec) }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("a write of the sandbox's record waits for the host to take the sandbox, which its writer holds")
		return nil
	}
}

func mustPut(t *testing.T, st sandbox.Store, h *host, rec *sandbox.Sandbox) {
	t.Helper()
	if err := put(t, st, h, rec); err != nil {
		t.Fatal(err)
	}
}

func next(t *testing.T, h *host) string {
	t.Helper()
	select {
	case e := <-h.events:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("the host was not told")
		return ""
	}
}

// A paused sandbox's row that names its image's root tells the host it may
// drop the disk's copy, once; a row without a root, or without a copy on
// the disk, does not.
func TestRowNamingThePausedRootLetsTheHostDropItsCopy(t *testing.T) {
	m, st, h, db := join(t)
	ctx := context.Background()
	rec := &sandbox.Sandbox{ID: m.IDs().SandboxID(), Team: "acme", State: sandbox.StatePaused, TemplateID: "base",
		StartedAt: time.Now().UTC(), EndAt: time.Now().UTC().Add(time.Hour), PausedImage: "/data/paused/x"}
	mustPut(t, st, h, rec) // not uploaded yet
	rec.PausedRoot = "b3-root"
	mustPut(t, st, h, rec)
	if got, want := next(t, h), "published "+rec.ID+" b3-root"; got != want {
		t.Fatalf("told %q, want %q", got, want)
	}
	if row, err := db.GetSandbox(ctx, rec.ID); err != nil || row.StoreRoot != "b3-root" {
		t.Fatalf("the row when the host is told: %+v %v", row, err)
	}
	rec.PausedImage = "" // the host dropped its copy
	mustPut(t, st, h, rec)
	m.mark(m.dirty, rec.ID) // and the sync loop writes it again
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case e := <-h.events:
			t.Fatalf("told again with no copy left: %q", e)
		default:
		}
	}
}

// A write of a sandbox that moved to another host meanwhile fails (its
// operation, say a resume, must not answer as if it went on here) and
// drops it, without waiting for the drop: the writer holds the sandbox,
// which the drop takes (before, the write never returned, and the
// sandbox and the host's syncs stayed stuck behind it).
func TestWriteOfAMovedSandboxDoesNotWaitForItsDrop(t *testing.T) {
	m, st, h, db := join(t)
	ctx := context.Background()
	rec := &sandbox.Sandbox{ID: m.IDs().SandboxID(), Team: "acme", State: sandbox.StatePaused, TemplateID: "base",
		StartedAt: time.Now().UTC(), EndAt: time.Now().UTC().Add(time.Hour), PausedRoot: "b3-root"}
	mustPut(t, st, h, rec)
	other, epoch, err := db.Register(ctx, "host-b", 1, "127.0.0.1:10")
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Heartbeat(ctx, clusterdb.Host{Slot: other, Epoch: epoch, CPUs: 2, MemTotalMB: 4096}, time.Minute); err != nil {
		t.Fatal(err)
	}
	row, err := db.GetSandbox(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Move(ctx, rec.ID, m.Slot(), row.Generation, other, 0); err != nil {
		t.Fatal(err)
	}
	rec.EndAt = rec.EndAt.Add(time.Minute) // a change the old host makes meanwhile (a resume)
	if err := put(t, st, h, rec); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "moved to another host") {
		t.Fatalf("writing the record of a sandbox that moved on: %v, want it refused as moved", err)
	}
	if got, want := next(t, h), "drop "+rec.ID; got != want {
		t.Fatalf("told %q, want %q", got, want)
	}
}
