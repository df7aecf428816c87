package clusterdb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/clusterdb/pgtest"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/ids"
)

var server *pgtest.Server

func TestMain(m *testing.M) { pgtest.Main(m, &server) }

// fresh returns a database of its own on the test server.
func fresh(t *testing.T) *DB {
	t.Helper()
	db, err := Open(context.Background(), server.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}

func TestMigrations(t *testing.T) {
	db := fresh(t)
	ctx := context.Background()
	var v int
	if err := db.pool.QueryRow(ctx, `SELECT max(version) FROM schema_migrations`).Scan(&v); err != nil || v != SchemaVersion() {
		t.Fatalf("schema version %d, %v; want %d", v, err, SchemaVersion())
	}
	// Again: nothing to do.
	if err := db.migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// A database from a newer cellfork is refused, not misused.
	if _, err := db.pool.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	if err := db.migrate(ctx); err == nil {
		t.Fatal("a newer schema was accepted")
	}
}

func setup(t *testing.T, db *DB) {
	t.Helper()
	ctx := context.Background()
	if err := db.PutRegion(ctx, Region{ID: 1, Name: "eu", Groups: []string{"europe"}}); err != nil {
		t.Fatal(err)
	}
	if err := db.PutTeam(ctx, Team{ID: "acme", MaxSandboxes: 3}); err != nil {
		t.Fatal(err)
	}
}

func heartbeat(t *testing.T, db *DB, slot int, epoch int64, memMB int64) error {
	t.Helper()
	return db.Heartbeat(context.Background(), Host{Slot: slot, Epoch: epoch, CPUs: 2, MemTotalMB: memMB}, time.Second)
}

// Slots are never reused, a host keeps its slot, and a host declared lost
// is fenced until it registers again.
func TestHostsLeasesAndLoss(t *testing.T) {
	db := fresh(t)
	setup(t, db)
	ctx := context.Background()
	a, ea, err := db.Register(ctx, "host-a", 1, "10.77.0.11:3000")
	if err != nil {
		t.Fatal(err)
	}
	b, eb, _ := db.Register(ctx, "host-b", 1, "10.77.0.12:3000")
	if a == b {
		t.Fatal("two hosts got one slot")
	}
	if again, _, _ := db.Register(ctx, "host-a", 1, "10.77.0.11:3001"); again != a {
		t.Fatalf("host-a came back on slot %d, not %d", again, a)
	}
	for _, hb := range []struct {
		slot  int
		epoch int64
	}{{a, ea}, {b, eb}} {
		if err := heartbeat(t, db, hb.slot, hb.epoch, 1024); err != nil {
			t.Fatal(err)
		}
	}
	// Leases run out for both, well past the grace: nobody else
	// heartbeated, so nobody is lost (a database outage looks like this).
	const grace = 500 * time.Millisecond
	time.Sleep(2 * time.Second)
	if lost, err := db.SweepLost(ctx, grace); err != nil || len(lost) != 0 {
		t.Fatalf("after everyone's silence: lost %v, %v", lost, err)
	}
	// The database is back and b is heard first: a still has the grace to
	// be heard, though its lease ended long before b's heartbeat.
	if err := heartbeat(t, db, b, eb, 1024); err != nil {
		t.Fatal(err)
	}
	if lost, err := db.SweepLost(ctx, grace); err != nil || len(lost) != 0 {
		t.Fatalf("b heard first after the outage: lost %v, %v", lost, err)
	}
	// b goes on heartbeating, a does not: a is lost once b has been heard
	// for the grace.
	time.Sleep(grace + 100*time.Millisecond)
	if err := heartbeat(t, db, b, eb, 1024); err != nil {
		t.Fatal(err)
	}
	if lost, err := db.SweepLost(ctx, time.Hour); err != nil || len(lost) != 0 {
		t.Fatalf("within the grace: lost %v, %v", lost, err)
	}
	if lost, err := db.SweepLost(ctx, grace); err != nil || len(lost) != 1 || lost[0] != a {
		t.Fatalf("lost %v, %v; want [%d]", lost, err, a)
	}
	if err := heartbeat(t, db, a, ea, 1024); !errors.Is(err, ErrFenced) {
		t.Fatalf("a lost host's heartbeat: %v", err)
	}
	slot, epoch, err := db.Register(ctx, "host-a", 1, "10.77.0.11:3000")
	if err != nil || slot != a || epoch != ea+1 {
		t.Fatalf("re-registered as %d epoch %d, %v", slot, epoch, err)
	}
	if err := heartbeat(t, db, a, epoch, 1024); err != nil {
		t.Fatal(err)
	}
}

// Reservations are atomic: concurrent placements never take more memory
// than a host has, and never more sandboxes than a team may run.
func TestReserveIsAtomic(t *testing.T) {
	db := fresh(t)
	setup(t, db)
	ctx := context.Background()
	if err := db.PutTeam(ctx, Team{ID: "big", MaxSandboxes: 0}); err != nil {
		t.Fatal(err)
	}
	slot, epoch, _ := db.Register(ctx, "h", 1, "x:1")
	if err := heartbeat(t, db, slot, epoch, 4096); err != nil {
		t.Fatal(err)
	}
	try := func(team string, n int) (ok, full, limited int64) {
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				err := db.Reserve(ctx, Sandbox{ID: ids.NewSandbox(1, slot), Team: team, Region: 1, HostSlot: slot, MemoryMB: 1024}, 0)
				switch {
				case err == nil:
					atomic.AddInt64(&ok, 1)
				case errors.Is(err, ErrNoCapacity):
					atomic.AddInt64(&full, 1)
				case errors.Is(err, ErrTeamLimit):
					atomic.AddInt64(&limited, 1)
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		return
	}
	if ok, full, limited := try("acme", 8); ok != 3 || limited+full != 5 {
		t.Fatalf("team bounded at 3: ok %d, full %d, limited %d", ok, full, limited)
	}
	if ok, full, _ := try("big", 8); ok != 1 || full != 7 {
		t.Fatalf("4 GiB host, 1 GiB each, 3 taken: ok %d, full %d", ok, full)
	}
	if err := db.Reserve(ctx, Sandbox{ID: ids.NewSandbox(1, slot), Team: "nobody", HostSlot: slot}, 0); !errors.Is(err, ErrNoTeam) {
		t.Errorf("unknown team: %v", err)
	}
	// Releasing gives both back.
	rows, _ := db.HostSandboxes(ctx, slot)
	for _, r := range rows {
		if err := db.Release(ctx, r.ID, slot, r.MemoryMB); err != nil {
			t.Fatal(err)
		}
	}
	teams, _ := db.Teams(ctx)
	for _, tm := range teams {
		if tm.Running != 0 {
			t.Errorf("team %s still counts %d running", tm.ID, tm.Running)
		}
	}
}

// A host writes its sandboxes' rows only while they live there; paused
// sandboxes do not count against the team; lists filter and page.
func TestSyncFencingAndList(t *testing.T) {
	db := fresh(t)
	setup(t, db)
	ctx := context.Background()
	a, ea, _ := db.Register(ctx, "a", 1, "x:1")
	b, _, _ := db.Register(ctx, "b", 1, "x:2")
	if err := heartbeat(t, db, a, ea, 8192); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	var ids_ []string
	for i := range 3 {
		id := ids.NewSandbox(1, a)
		ids_ = append(ids_, id)
		s := Sandbox{ID: id, Team: "acme", Region: 1, HostSlot: a, State: "running", MemoryMB: 512, TemplateID: "base",
			StartedAt: t0.Add(time.Duration(i) * time.Second), Metadata: map[string]string{"k": fmt.Sprint(i % 2)},
			Doc: json.RawMessage(`{"sandboxID":"` + id + `"}`)}
		if err := db.Sync(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Sync(ctx, Sandbox{ID: ids.NewSandbox(1, a), Team: "acme", HostSlot: a, State: "running", Doc: json.RawMessage(`{}`)}); !errors.Is(err, ErrTeamLimit) {
		t.Errorf("a fourth running sandbox of a team bounded at 3: %v", err)
	}
	// Pausing frees a place.
	if err := db.Sync(ctx, Sandbox{ID: ids_[0], Team: "acme", HostSlot: a, State: "paused", StartedAt: t0, Metadata: map[string]string{"k": "0"}, Doc: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := db.Sync(ctx, Sandbox{ID: ids.NewSandbox(1, a), Team: "acme", HostSlot: a, State: "running", StartedAt: t0.Add(time.Hour), Doc: json.RawMessage(`{}`)}); err != nil {
		t.Errorf("after a pause: %v", err)
	}
	// Another host cannot write a row that is not its own.
	if err := db.Sync(ctx, Sandbox{ID: ids_[1], Team: "acme", HostSlot: b, State: "running", Doc: json.RawMessage(`{}`)}); !errors.Is(err, ErrStale) {
		t.Errorf("host b writing host a's sandbox: %v", err)
	}
	page, err := db.ListSandboxes(ctx, ListFilter{Team: "acme", States: []string{"running", "paused"}, Metadata: map[string]string{"k": "0"}, Limit: 10})
	if err != nil || len(page) != 2 || page[0].ID != ids_[0] || page[1].ID != ids_[2] {
		t.Fatalf("metadata filter: %+v, %v", page, err)
	}
	desc, _ := db.ListSandboxes(ctx, ListFilter{Team: "acme", States: []string{"running", "paused"}, Desc: true, Limit: 2})
	next, _ := db.ListSandboxes(ctx, ListFilter{Team: "acme", States: []string{"running", "paused"}, Desc: true, Limit: 10,
		CursorID: desc[1].ID, CursorStarted: desc[1].StartedAt})
	if len(desc) != 2 || len(next) != 2 || next[0].StartedAt.After(desc[1].StartedAt) {
		t.Fatalf("paging newest first: %v then %v", desc, next)
	}
	if other, _ := db.ListSandboxes(ctx, ListFilter{Team: "other", States: []string{"running"}, Limit: 10}); len(other) != 0 {
		t.Error("a team saw another's sandboxes")
	}
}

// A paused sandbox whose image is in the store moves to another host by
// compare-and-swap: only from the host and generation read, only onto a
// host with room; then its old host's writes are stale, the new host's
// go through, and the moved map names it.
func TestMoveIsACompareAndSwap(t *testing.T) {
	db := fresh(t)
	setup(t, db)
	ctx := context.Background()
	a, b := twoLiveHosts(t, db)
	id := ids.NewSandbox(1, a)
	s := Sandbox{ID: id, Team: "acme", Region: 1, HostSlot: a, State: "paused", MemoryMB: 512, Doc: json.RawMessage(`{}`),
		Record: json.RawMessage(`{"ID":"` + id + `"}`), Runtime: "v1"}
	if err := db.Sync(ctx, s); err != nil {
		t.Fatal(err)
	}
	row, _ := db.GetSandbox(ctx, id)
	if err := db.Move(ctx, id, a, row.Generation, b, 0); !errors.Is(err, ErrStale) {
		t.Fatalf("moving a paused sandbox whose image is not in the store: %v", err)
	}
	s.StoreRoot = "root1"
	if err := db.Sync(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := db.Move(ctx, id, a, row.Generation, b, 8192); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("moving onto a host without room: %v", err)
	}
	if err := db.Move(ctx, id, a, row.Generation+1, b, 0); !errors.Is(err, ErrStale) {
		t.Fatalf("moving from a generation that is not the row's: %v", err)
	}
	if err := db.Move(ctx, id, a, row.Generation, b, 0); err != nil {
		t.Fatal(err)
	}
	if err := db.Move(ctx, id, a, row.Generation, b, 0); !errors.Is(err, ErrStale) {
		t.Fatalf("a second move of the same read: %v", err)
	}
	got, err := db.GetRecord(ctx, id)
	if err != nil || got.HostSlot != b || got.HomeSlot != a || got.Generation != row.Generation+1 || got.StoreRoot != "root1" ||
		got.Runtime != "v1" || !strings.Contains(string(got.Record), id) {
		t.Fatalf("row after the move: %+v %v", got, err)
	}
	if err := db.Sync(ctx, s); !errors.Is(err, ErrStale) {
		t.Errorf("the old host writing after the move: %v", err)
	}
	s.HostSlot, s.State, s.StoreRoot = b, "running", ""
	if err := db.Sync(ctx, s); err != nil {
		t.Errorf("the new host writing after the move: %v", err)
	}
	if moved, _ := db.Moved(ctx); moved[id] != b {
		t.Errorf("moved map: %v", moved)
	}
	// The old host asks which of its copies moved away: this one, not an
	// id of its own or one with no row.
	mine := ids.NewSandbox(1, a)
	if err := db.Sync(ctx, Sandbox{ID: mine, Team: "acme", Region: 1, HostSlot: a, State: "running", MemoryMB: 512, Doc: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if away, err := db.AwayFrom(ctx, a, []string{id, mine, ids.NewSandbox(1, a)}); err != nil || len(away) != 1 || away[0] != id {
		t.Errorf("away from host %d: %v %v", a, away, err)
	}
}

// The roots a collection keeps are the rows' (snapshots' and paused
// sandboxes'), and one host claims each round of a job.
func TestStoreRootsAndJobRounds(t *testing.T) {
	db := fresh(t)
	setup(t, db)
	ctx := context.Background()
	a, ea, _ := db.Register(ctx, "a", 1, "x:1")
	if err := heartbeat(t, db, a, ea, 8192); err != nil {
		t.Fatal(err)
	}
	paused := Sandbox{ID: ids.NewSandbox(1, a), Team: "acme", Region: 1, HostSlot: a, State: "paused", MemoryMB: 512,
		Doc: json.RawMessage(`{}`), StoreRoot: "rootP"}
	running := Sandbox{ID: ids.NewSandbox(1, a), Team: "acme", Region: 1, HostSlot: a, State: "running", MemoryMB: 512, Doc: json.RawMessage(`{}`)}
	for _, s := range []Sandbox{paused, running} {
		if err := db.Sync(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for i, root := range []string{"rootS", "", "rootP"} {
		sn := Snapshot{ID: fmt.Sprintf("snap%d", i), Team: "acme", Region: 1, HostSlot: a, SandboxID: running.ID, CreatedAt: time.Now(),
			Doc: json.RawMessage(`{}`), StoreRoot: root}
		if err := db.SyncSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	roots, err := db.StoreRoots(ctx)
	slices.Sort(roots)
	if err != nil || !slices.Equal(roots, []string{"rootP", "rootS"}) {
		t.Fatalf("roots %v, %v", roots, err)
	}
	if err := db.ForgetSnapshot(ctx, "snap0"); err != nil {
		t.Fatal(err)
	}
	if roots, _ := db.StoreRoots(ctx); !slices.Equal(roots, []string{"rootP"}) {
		t.Fatalf("roots after a snapshot is deleted: %v", roots)
	}

	got := make(chan bool, 4)
	for slot := range 4 {
		go func() {
			ok, err := db.ClaimJob(ctx, "gc", slot, time.Hour)
			if err != nil {
				t.Error(err)
			}
			got <- ok
		}()
	}
	claims := 0
	for range 4 {
		if <-got {
			claims++
		}
	}
	if claims != 1 {
		t.Fatalf("%d hosts claimed the first round, want 1", claims)
	}
	if ok, _ := db.ClaimJob(ctx, "gc", 9, time.Hour); ok {
		t.Error("a round claimed again within its interval")
	}
	if ok, _ := db.ClaimJob(ctx, "other", 9, time.Hour); !ok {
		t.Error("another job's first round was not claimed")
	}
	if ok, _ := db.ClaimJob(ctx, "gc", 9, 0); !ok {
		t.Error("the next round was not claimed once due")
	}
}

// TestTemplateBuilds: a published build is found by template id, name,
// name:tag and build id for its team only, the newest first; a sync moves tags, keeps
// a build still being built and forgets the rest; its roots are live.
func TestTemplateBuilds(t *testing.T) {
	db := fresh(t)
	ctx := context.Background()
	put := func(build string, tags ...string) {
		t.Helper()
		err := db.PutTemplateBuild(ctx, TemplateBuild{BuildID: build, Team: "acme", TemplateID: "tpl1", Names: []string{"web"},
			Tags: tags, Runtime: "r1", Roots: []string{"img-" + build, "layer-" + build}, Artifact: []byte(`{"buildID":"` + build + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
	}
	find := func(team, name, tag string) string {
		t.Helper()
		b, err := db.FindTemplateBuild(ctx, team, name, tag)
		if errors.Is(err, errdefs.ErrNotFound) {
			return "none"
		}
		if err != nil {
			t.Fatal(err)
		}
		return b.BuildID
	}
	put("b1", "default", "v1")
	time.Sleep(5 * time.Millisecond)
	put("b2", "default")
	for _, c := range []struct{ team, name, tag, want string }{
		{"acme", "web", "", "b2"}, {"acme", "tpl1", "", "b2"}, {"acme", "web", "v1", "b1"}, {"acme", "web", "default", "b2"},
		{"other", "web", "", "none"}, {"acme", "web", "v9", "none"}, {"acme", "nope", "", "none"},
	} {
		if got := find(c.team, c.name, c.tag); got != c.want {
			t.Errorf("find(%s, %s, %s) = %s, want %s", c.team, c.name, c.tag, got, c.want)
		}
	}
	for _, c := range []struct{ team, id, want string }{{"acme", "b1", "b1"}, {"acme", "b2", "b2"}, {"other", "b1", "none"}, {"acme", "b9", "none"}} {
		b, err := db.TemplateBuildByID(ctx, c.team, c.id)
		got := b.BuildID
		if errors.Is(err, errdefs.ErrNotFound) {
			got = "none"
		} else if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("TemplateBuildByID(%s, %s) = %s, want %s", c.team, c.id, got, c.want)
		}
	}
	roots, _ := db.StoreRoots(ctx)
	slices.Sort(roots)
	if want := []string{"img-b1", "img-b2", "layer-b1", "layer-b2"}; !slices.Equal(roots, want) {
		t.Errorf("roots %v, want %v", roots, want)
	}
	// b3 is being built (nil tags: left alone); v1 moves to b2; b1 goes.
	put("b3", "default")
	if err := db.SyncTemplate(ctx, "acme", "tpl1", []string{"web", "site"}, map[string][]string{"b2": {"default", "v1"}, "b3": nil}); err != nil {
		t.Fatal(err)
	}
	if got := find("acme", "site", "v1"); got != "b2" {
		t.Errorf("after sync, site:v1 = %s, want b2", got)
	}
	if got := find("acme", "web", ""); got != "b3" {
		t.Errorf("after sync, web = %s, want b3 (kept while building)", got)
	}
	if err := db.SyncTemplate(ctx, "acme", "tpl1", nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := find("acme", "tpl1", ""); got != "none" {
		t.Errorf("a deleted template is still found: %s", got)
	}
	if roots, _ := db.StoreRoots(ctx); len(roots) != 0 {
		t.Errorf("a deleted template's roots are live: %v", roots)
	}
}

// TestHandIsACompareAndSwap: a running sandbox's row is handed to another
// host once per read of it (host and generation), never a paused one, and
// its old host's next write is stale.
func TestHandIsACompareAndSwap(t *testing.T) {
	db := fresh(t)
	setup(t, db)
	ctx := context.Background()
	a, b := twoLiveHosts(t, db)
	id := ids.NewSandbox(1, a)
	s := Sandbox{ID: id, Team: "acme", Region: 1, HostSlot: a, State: "paused", MemoryMB: 512, Doc: json.RawMessage(`{}`)}
	if err := db.Sync(ctx, s); err != nil {
		t.Fatal(err)
	}
	row, _ := db.GetSandbox(ctx, id)
	if err := db.Hand(ctx, id, a, row.Generation, b); !errors.Is(err, ErrStale) {
		t.Fatalf("handing a paused sandbox: %v", err)
	}
	s.State = "running"
	if err := db.Sync(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := db.Hand(ctx, id, a, row.Generation+1, b); !errors.Is(err, ErrStale) {
		t.Fatalf("handing from another generation: %v", err)
	}
	if err := db.Hand(ctx, id, a, row.Generation, b); err != nil {
		t.Fatal(err)
	}
	if err := db.Hand(ctx, id, a, row.Generation, b); !errors.Is(err, ErrStale) {
		t.Fatalf("a second hand-over of the same read: %v", err)
	}
	if err := db.Sync(ctx, s); !errors.Is(err, ErrStale) {
		t.Fatalf("the old host's write after the hand-over: %v", err)
	}
	moved, err := db.Moved(ctx)
	if err != nil || moved[id] != b {
		t.Fatalf("moved map %v, %v", moved, err)
	}
	if err := db.Hand(ctx, id, b, row.Generation+1, a); err != nil {
		t.Fatalf("handing it back: %v", err)
	}
}

// TestTombstones: a host that was away does not write back the row of a
// sandbox that moved on and ended meanwhile (its kill left a tombstone),
// nor of one a gateway forgot with its lost host; a sandbox that never had
// a row gets one; tombstones are pruned by age.
func TestTombstones(t *testing.T) {
	db := fresh(t)
	setup(t, db)
	ctx := context.Background()
	a, b := twoLiveHosts(t, db)
	id := ids.NewSandbox(1, a)
	s := Sandbox{ID: id, Team: "acme", Region: 1, HostSlot: a, State: "paused", MemoryMB: 512, Doc: json.RawMessage(`{}`), StoreRoot: "r1"}
	if err := db.Sync(ctx, s); err != nil {
		t.Fatal(err)
	}
	row, _ := db.GetSandbox(ctx, id)
	if err := db.Move(ctx, id, a, row.Generation, b, 0); err != nil {
		t.Fatal(err)
	}
	if err := db.Forget(ctx, id, b); err != nil { // killed on b
		t.Fatal(err)
	}
	if err := db.Sync(ctx, s); !errors.Is(err, ErrStale) {
		t.Fatalf("host a writing back the row of a sandbox that ended on b: %v", err)
	}
	lost := ids.NewSandbox(1, a)
	ls := Sandbox{ID: lost, Team: "acme", Region: 1, HostSlot: a, State: "paused", MemoryMB: 512, Doc: json.RawMessage(`{}`)}
	if err := db.Sync(ctx, ls); err != nil {
		t.Fatal(err)
	}
	if ok, err := db.ForgetLost(ctx, lost, "acme"); err != nil || !ok {
		t.Fatalf("ForgetLost: %v %v", ok, err)
	}
	if err := db.Sync(ctx, ls); !errors.Is(err, ErrStale) {
		t.Fatalf("writing back a sandbox forgotten with its lost host: %v", err)
	}
	fresh := Sandbox{ID: ids.NewSandbox(1, a), Team: "acme", Region: 1, HostSlot: a, State: "running", MemoryMB: 512, Doc: json.RawMessage(`{}`)}
	if err := db.Sync(ctx, fresh); err != nil {
		t.Fatalf("a sandbox with no row yet: %v", err)
	}
	if err := db.PruneTombstones(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := db.Sync(ctx, s); !errors.Is(err, ErrStale) {
		t.Fatalf("a young tombstone was pruned: %v", err)
	}
	if err := db.PruneTombstones(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := db.Sync(ctx, s); err != nil {
		t.Fatalf("after its tombstone was pruned: %v", err)
	}
}

// twoLiveHosts registers hosts "a" and "b" in region 1, each heartbeating
// with 8 GiB, and returns their slots.
func twoLiveHosts(t *testing.T, db *DB) (a, b int) {
	t.Helper()
	ctx := context.Background()
	a, ea, _ := db.Register(ctx, "a", 1, "x:1")
	b, eb, _ := db.Register(ctx, "b", 1, "x:2")
	for _, h := range []struct {
		slot  int
		epoch int64
	}{{a, ea}, {b, eb}} {
		if err := heartbeat(t, db, h.slot, h.epoch, 8192); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

// TestBuiltinTemplates: the first root published for a built-in
// template's definition is the one every host gets, however many publish
// at once; it is live for the store's collection.
func TestBuiltinTemplates(t *testing.T) {
	db := fresh(t)
	ctx := context.Background()
	if root, err := db.BuiltinRoot(ctx, "base", "def1"); err != nil || root != "" {
		t.Fatalf("before any publish: %q, %v", root, err)
	}
	got := make([]string, 8)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			root, err := db.PublishBuiltin(ctx, "base", "def1", fmt.Sprintf("root%d", i))
			if err != nil {
				t.Error(err)
			}
			got[i] = root
		})
	}
	wg.Wait()
	for _, r := range got {
		if r != got[0] || !strings.HasPrefix(r, "root") {
			t.Fatalf("concurrent publishes got %v: not one root", got)
		}
	}
	if root, err := db.BuiltinRoot(ctx, "base", "def1"); err != nil || root != got[0] {
		t.Fatalf("found %q, %v; want %q", root, err, got[0])
	}
	if root, _ := db.PublishBuiltin(ctx, "base", "def2", "rootX"); root != "rootX" {
		t.Fatalf("another definition: %q", root)
	}
	if root, _ := db.BuiltinRoot(ctx, "other", "def1"); root != "" {
		t.Fatalf("another template: %q", root)
	}
	roots, err := db.StoreRoots(ctx)
	if err != nil || !slices.Contains(roots, got[0]) || !slices.Contains(roots, "rootX") {
		t.Fatalf("live roots %v, %v", roots, err)
	}
}
