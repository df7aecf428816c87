package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/placement"
	"github.com/cellfork/cellfork/test/cluster/harness"
)

// waitUploaded waits until the snapshot's image is in the cluster's chunk
// store (its row names the manifest) and returns what GET /snapshots/ID says.
func waitUploaded(t *testing.T, id string) map[string]any {
	t.Helper()
	var doc map[string]any
	eventually(t, 60*time.Second, "snapshot "+id+" to be uploaded", func() bool {
		doc = nil
		_ = jsonOf(do(t, "eu", "GET", "/snapshots/"+id, nil, nil), &doc)
		if doc["uploadState"] == "failed" {
			t.Fatalf("upload failed: %v", doc)
		}
		return doc["uploadState"] == "uploaded"
	})
	return doc
}

// pausedInStore waits until paused sandbox id's row names its image in the
// chunk store, and returns the cluster database (closed when t ends).
func pausedInStore(t *testing.T, id string) *clusterdb.DB {
	t.Helper()
	ctx := context.Background()
	db := openDB(t)
	t.Cleanup(db.Close)
	eventually(t, 60*time.Second, "the paused image to be in the chunk store", func() bool {
		row, err := db.GetSandbox(ctx, id)
		return err == nil && row.StoreRoot != ""
	})
	return db
}

// testSnapshotTravels: a snapshot taken on one host starts a sandbox on
// another, which fetches its image from the chunk store: the exact state
// comes back (a REPL variable, a file, a process and its pid, a listening
// socket), and a rollback of that sandbox onto the snapshot (not on its
// host) imports it again.
func testSnapshotTravels(t *testing.T) {
	ctx := context.Background()
	src := create(t, "eu", nil)
	a := hostOf(t, src)
	setup := `
import os, socket, subprocess
x = 41
open("/tmp/travel.txt", "w").write("packed on host A")
p = subprocess.Popen(["sleep", "1000"])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 8123)); srv.listen()
print(p.pid)`
	out, status := runCode(t, "eu", src, setup)
	pid := strings.TrimSpace(out)
	if status != 200 || pid == "" {
		t.Fatalf("setting state up: %d %q", status, out)
	}
	r := do(t, "eu", "POST", "/sandboxes/"+src.ID+"/snapshots", map[string]any{"name": "travel"}, nil)
	if r.status != 201 {
		t.Fatalf("snapshot: %d %s", r.status, r.body)
	}
	var sn struct {
		ID string `json:"snapshotID"`
	}
	r.json(t, &sn)
	t.Cleanup(func() { do(t, "eu", "DELETE", "/snapshots/"+sn.ID, nil, nil) })
	doc := waitUploaded(t, sn.ID)
	if root, _ := doc["storeRoot"].(string); root == "" {
		t.Fatalf("uploaded without a root: %v", doc)
	}

	// Host A takes no new sandboxes: the create goes elsewhere.
	slot := fmt.Sprint(a.N)
	if err := c.Admin(ctx, "cordon", slot); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Admin(ctx, "activate", slot); err != nil {
			t.Errorf("activating host %s again: %v", slot, err)
		}
	}()
	time.Sleep(2 * time.Second) // the gateways hear of it (NOTIFY)
	r = do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": "travel", "timeout": 120}, nil)
	if r.status != 201 {
		t.Fatalf("create from the snapshot with its host cordoned: %d %s", r.status, r.body)
	}
	var moved sandbox
	r.json(t, &moved)
	t.Cleanup(func() { do(t, "eu", "DELETE", "/sandboxes/"+moved.ID, nil, nil) })
	if b := hostOf(t, moved); b.N == a.N {
		t.Fatalf("created on the cordoned host %d", a.N)
	}
	if st := r.header.Get("Server-Timing"); !strings.Contains(st, "import;dur=") {
		t.Errorf("the create did not import the image: Server-Timing %q", st)
	}
	check := `
import os, socket
c = socket.create_connection(("127.0.0.1", 8123), timeout=5); c.close()
os.kill(p.pid, 0)
print(x, open("/tmp/travel.txt").read(), p.pid, p.poll())`
	want := fmt.Sprintf("41 packed on host A %s None\n", pid)
	if out, status := runCode(t, "eu", moved, check); out != want {
		t.Fatalf("state on the other host: %d %q, want %q", status, out, want)
	}

	// Rollback onto the snapshot, which is not on this sandbox's host.
	if out, _ := runCode(t, "eu", moved, "x = 0; print(x)"); out != "0\n" {
		t.Fatalf("changing x: %q", out)
	}
	r = do(t, "eu", "POST", "/sandboxes/"+moved.ID+"/rollback", map[string]any{"snapshotID": sn.ID}, nil)
	if r.status != 200 || !strings.Contains(r.header.Get("Server-Timing"), "import;dur=") {
		t.Fatalf("rollback onto the imported snapshot: %d %s (Server-Timing %q)", r.status, r.body, r.header.Get("Server-Timing"))
	}
	if out, status := runCode(t, "eu", moved, check); out != want {
		t.Fatalf("state after the rollback: %d %q, want %q", status, out, want)
	}
}

// testPausedMoves: a sandbox paused on a host that then dies resumes on
// another host through the chunk store, with its id, its access token and
// its state (a REPL variable, a file); its old host, back, drops its copy.
func testPausedMoves(t *testing.T) {
	ctx := context.Background()
	sb := create(t, "eu", nil)
	a := hostOf(t, sb)
	if out, status := runCode(t, "eu", sb, `x = 7; open("/tmp/moved.txt", "w").write("paused on A"); print(x)`); out != "7\n" {
		t.Fatalf("setting state up: %d %q", status, out)
	}
	if r := do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/pause", nil, nil); r.status != 204 {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	db := pausedInStore(t, sb.ID)
	// Its row names its image in the store: the host keeps it there only.
	eventually(t, 10*time.Second, "the host to drop the paused image's copy on its disk", func() bool {
		_, err := os.Stat(filepath.Join(a.DataDir, "paused", sb.ID))
		return os.IsNotExist(err)
	})
	// A second paused sandbox of that host moves too and ends elsewhere
	// before the host is back: the host must not bring it back.
	var ended sandbox
	for ended.ID == "" || hostOf(t, ended).N != a.N {
		if ended.ID != "" {
			do(t, "eu", "DELETE", "/sandboxes/"+ended.ID, nil, nil)
		}
		ended = create(t, "eu", nil)
	}
	if r := do(t, "eu", "POST", "/sandboxes/"+ended.ID+"/pause", nil, nil); r.status != 204 {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	pausedInStore(t, ended.ID)

	a.Kill()
	restarted := false
	defer func() {
		if !restarted {
			if err := a.Start(); err != nil {
				t.Errorf("starting host %d again: %v", a.N, err)
			}
		}
	}()
	t0 := time.Now()
	var r resp
	eventually(t, 40*time.Second, "the paused sandbox to resume on another host", func() bool {
		r = do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120}, nil)
		return r.status/100 == 2
	})
	t.Logf("resumed elsewhere %v after its host was killed (Server-Timing %s)", time.Since(t0).Round(100*time.Millisecond), r.header.Get("Server-Timing"))
	if st := r.header.Get("Server-Timing"); !strings.Contains(st, "import;dur=") || !strings.Contains(st, "move;dur=") {
		t.Errorf("the resume did not move and import: Server-Timing %q", st)
	}
	row, err := db.GetSandbox(ctx, sb.ID)
	if err != nil || row.HostSlot == a.N || row.HomeSlot != a.N || row.State != "running" {
		t.Fatalf("row after the move: %+v %v", row, err)
	}
	if out, status := runCode(t, "eu", sb, `print(x, open("/tmp/moved.txt").read())`); out != "7 paused on A\n" {
		t.Fatalf("state on the new host (same token): %d %q", status, out)
	}
	if r := do(t, "eu", "POST", "/sandboxes/"+ended.ID+"/connect", map[string]any{"timeout": 120}, nil); r.status/100 != 2 {
		t.Fatalf("resuming the second sandbox elsewhere: %d %s", r.status, r.body)
	}
	if r := do(t, "eu", "DELETE", "/sandboxes/"+ended.ID, nil, nil); r.status != 204 {
		t.Fatalf("killing the second sandbox on its new host: %d %s", r.status, r.body)
	}

	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	eventually(t, 30*time.Second, "the old host to drop its copies", func() bool {
		ids, ok := listed(t, a)
		return ok && !slices.Contains(ids, sb.ID) && !slices.Contains(ids, ended.ID)
	})
	if _, err := db.GetSandbox(ctx, ended.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the old host wrote back the row of a sandbox that ended elsewhere: %v", err)
	}
	if r := do(t, "eu", "GET", "/sandboxes/"+ended.ID, nil, nil); r.status != 404 {
		t.Errorf("a sandbox that ended elsewhere, after its old host came back: %d %s", r.status, r.body)
	}
	if out, _ := runCode(t, "eu", sb, "print(x + 1)"); out != "8\n" {
		t.Errorf("after the old host came back: %q", out)
	}
	if row, err := db.GetSandbox(ctx, sb.ID); err != nil || row.HostSlot == a.N {
		t.Errorf("row after the old host came back: %+v %v", row, err)
	}
}

// testEvacuate: an operator drains a host and evacuates its paused
// sandboxes, then (--running) checkpoints and moves its running one; each
// is shown, and used on its new host with its state.
func testEvacuate(t *testing.T) {
	ctx := context.Background()
	sb := create(t, "eu", nil)
	a := hostOf(t, sb)
	if out, status := runCode(t, "eu", sb, `y = "evacuated"; print(y)`); out != "evacuated\n" {
		t.Fatalf("setting state up: %d %q", status, out)
	}
	// A fork child: running, on the same host, with the same state.
	r := do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/fork", map[string]any{"count": 1, "timeout": 120}, nil)
	var forked []struct {
		Sandbox *sandbox `json:"sandbox"`
	}
	if r.status != 201 || jsonOf(r, &forked) != nil || len(forked) != 1 || forked[0].Sandbox == nil {
		t.Fatalf("fork: %d %s", r.status, r.body)
	}
	child := *forked[0].Sandbox
	t.Cleanup(func() { do(t, "eu", "DELETE", "/sandboxes/"+child.ID, nil, nil) })
	if h := hostOf(t, child); h.N != a.N {
		t.Fatalf("the fork child is on host %d, not its parent's %d", h.N, a.N)
	}
	if r := do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/pause", map[string]any{"spill": true}, nil); r.status != 204 {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	slot := fmt.Sprint(a.N)
	if out, err := c.AdminOut(ctx, "evacuate", slot); err == nil || !strings.Contains(err.Error(), "cordon or drain it first") {
		t.Errorf("evacuating an active host: %q %v", out, err)
	}
	if err := c.Admin(ctx, "drain", slot); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Admin(ctx, "activate", slot); err != nil {
			t.Errorf("activating host %s again: %v", slot, err)
		}
	}()
	db := pausedInStore(t, sb.ID)
	out, err := c.AdminOut(ctx, "evacuate", slot)
	if err != nil || !strings.Contains(out, sb.ID+" -> host ") || !strings.Contains(out, "1 sandboxes moved, 0 stay (and 1 running: --running") {
		t.Fatalf("evacuate: %q %v", out, err)
	}
	t.Logf("evacuate: %s", out)
	time.Sleep(time.Second) // the gateways hear of the move (NOTIFY)
	var info map[string]any
	if r := do(t, "eu", "GET", "/sandboxes/"+sb.ID, nil, nil); jsonOf(r, &info) != nil || info["state"] != "paused" {
		t.Fatalf("get on the new host: %d %s", r.status, r.body)
	}
	if r := do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 60}, nil); r.status/100 != 2 {
		t.Fatalf("connect on the new host: %d %s", r.status, r.body)
	}
	if out, status := runCode(t, "eu", sb, `print(y)`); out != "evacuated\n" {
		t.Fatalf("state on the new host: %d %q", status, out)
	}
	if row, err := db.GetSandbox(ctx, sb.ID); err != nil || row.HostSlot == a.N {
		t.Errorf("row after the evacuation: %+v %v", row, err)
	}

	// The running one: checkpointed, moved and running again.
	out, err = c.AdminOut(ctx, "evacuate", slot, "--running")
	if err != nil || !strings.Contains(out, child.ID+" -> host ") || !strings.Contains(out, "running again after") || !strings.Contains(out, "1 sandboxes moved, 0 stay") {
		t.Fatalf("evacuate --running: %q %v", out, err)
	}
	t.Logf("evacuate --running: %s", out)
	time.Sleep(time.Second)
	if out, status := runCode(t, "eu", child, `print(y)`); out != "evacuated\n" {
		t.Fatalf("the running sandbox's state on its new host: %d %q", status, out)
	}
	if row, err := db.GetSandbox(ctx, child.ID); err != nil || row.HostSlot == a.N || row.State != "running" {
		t.Errorf("the running sandbox's row after the evacuation: %+v %v", row, err)
	}
}

// testForkOverflows: fork(4) of a parent whose host has room for 2 more
// children like it (the parent is sized so) makes 2 children there and
// puts the other 2 on other hosts, from the parent's state through the
// parent's host (peer) before the chunk store; every child has that
// state, and the snapshot that carried it is gone afterwards.
func testForkOverflows(t *testing.T) {
	parent, a := parentWithRoomFor(t, 2)
	if out, status := runCode(t, "eu", parent, `z = "from the parent"; print(z)`); out != "from the parent\n" {
		t.Fatalf("setting state up: %d %q", status, out)
	}
	if r := do(t, "eu", "POST", "/sandboxes/"+parent.ID+"/fork", map[string]any{"count": 65}, nil); r.status != 400 || !strings.Contains(string(r.body), "at most 64") {
		t.Errorf("fork(65) beyond the parent's host: %d %s", r.status, r.body)
	}
	r := do(t, "eu", "POST", "/sandboxes/"+parent.ID+"/fork", map[string]any{"count": 4, "timeout": 60}, nil)
	if r.status != 201 {
		t.Fatalf("fork: %d %s", r.status, r.body)
	}
	var results []struct {
		Sandbox *sandbox `json:"sandbox"`
		Error   *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	r.json(t, &results)
	if len(results) != 4 {
		t.Fatalf("fork(4) answered %d entries: %s", len(results), r.body)
	}
	elsewhere := 0
	var remote sandbox
	for i, res := range results {
		if res.Error != nil || res.Sandbox == nil {
			t.Fatalf("child %d: %+v (%s)", i, res.Error, r.body)
		}
		child := *res.Sandbox
		t.Cleanup(func() { do(t, "eu", "DELETE", "/sandboxes/"+child.ID, nil, nil) })
		if hostOf(t, child).N != a.N {
			elsewhere++
			remote = child
		}
		if out, status := runCode(t, "eu", child, "print(z)"); out != "from the parent\n" {
			t.Errorf("child %d (%s): %d %q", i, child.ID, status, out)
		}
	}
	if elsewhere != 2 {
		t.Fatalf("%d of 4 children on hosts other than the parent's host %d, which had room for 2: want 2", elsewhere, a.N)
	}
	// Those children's image came from the parent's host, not the store:
	// offered there (manifest), fetched by their host (peer), the upload
	// not waited for (no export), every object from the peer.
	st := r.header.Get("Server-Timing")
	t.Logf("2 of 4 children on other hosts; Server-Timing %s", st)
	if !strings.Contains(st, "manifest;dur=") || !strings.Contains(st, "peer;dur=") || strings.Contains(st, "export;dur=") {
		t.Errorf("the fork's Server-Timing has no manifest and peer phases, or waited for the upload: %s", st)
	}
	rh := hostOf(t, remote)
	var fetched []string
	for _, line := range strings.Split(rh.Logs(), "\n") {
		if strings.Contains(line, `msg="image imported from a peer"`) && strings.Contains(line, "peer="+a.Addr+" ") {
			fetched = append(fetched, line)
		}
	}
	if len(fetched) == 0 {
		t.Errorf("host %d did not log an import from the parent's host %s", rh.N, a.Addr)
	}
	for _, line := range fetched {
		if !strings.Contains(line, " store_objects=0 ") {
			t.Errorf("host %d imported from the parent's host with help from the store: %s", rh.N, line)
		}
	}
	eventually(t, 10*time.Second, "the transfer snapshot to be deleted", func() bool {
		var page []map[string]any
		return jsonOf(do(t, "eu", "GET", "/snapshots?sandboxID="+parent.ID, nil, nil), &page) == nil && len(page) == 0
	})

	// Merge the child on another host: the parent's id goes on there with
	// the child's state and the parent's token; no bytes move.
	b := hostOf(t, remote)
	var got struct {
		ParentID string `json:"parentSandboxID"`
	}
	if jsonOf(do(t, "eu", "GET", "/sandboxes/"+remote.ID, nil, nil), &got) != nil || got.ParentID != parent.ID {
		t.Errorf("the child on host %d names parent %q, want %q", b.N, got.ParentID, parent.ID)
	}
	if out, _ := runCode(t, "eu", remote, `z = "from the remote child"; print(z)`); out != "from the remote child\n" {
		t.Fatalf("changing the remote child: %q", out)
	}
	r = do(t, "eu", "POST", "/sandboxes/"+parent.ID+"/merge", map[string]any{"sandboxID": remote.ID}, nil)
	if r.status != 200 || !strings.Contains(r.header.Get("Server-Timing"), "assume;dur=") {
		t.Fatalf("merge across hosts: %d %s (Server-Timing %q)", r.status, r.body, r.header.Get("Server-Timing"))
	}
	t.Logf("merge across hosts (%d into %d): Server-Timing %s", b.N, a.N, r.header.Get("Server-Timing"))
	var merged sandbox
	r.json(t, &merged)
	if merged.ID != parent.ID || merged.Token != parent.Token {
		t.Errorf("merged answer %+v, want the parent's id and token", merged)
	}
	if out, status := runCode(t, "eu", parent, "print(z)"); out != "from the remote child\n" {
		t.Errorf("the parent after the merge: %d %q", status, out)
	}
	if r := do(t, "eu", "GET", "/sandboxes/"+remote.ID, nil, nil); r.status != 404 {
		t.Errorf("the merged child's id: %d %s", r.status, r.body)
	}
	eventually(t, 10*time.Second, "the parent's old host to drop its copy", func() bool {
		return !hostLists(t, a, parent.ID) && hostLists(t, b, parent.ID)
	})
	if r := do(t, "eu", "POST", "/sandboxes/"+parent.ID+"/merge", map[string]any{"sandboxID": remote.ID}, nil); r.status != 404 {
		t.Errorf("merging the gone child again: %d %s", r.status, r.body)
	}
}

// parentWithRoomFor creates a sandbox of region eu whose host, as the
// gateway sees it, has room for exactly n more of its size: its memory
// is a third of a host's free memory or so, chosen from the hosts' rows,
// and checked once its host's row counts it (and the gateway has read
// that row); a parent whose host's room came out otherwise (sandboxes
// of earlier tests still going away) is killed and another made.
func parentWithRoomFor(t *testing.T, n int64) (sandbox, *harness.Host) {
	t.Helper()
	ctx := context.Background()
	db := openDB(t)
	defer db.Close()
	hostRow := func(slot int) clusterdb.Host {
		t.Helper()
		hosts, err := db.Hosts(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hosts {
			if h.Slot == slot {
				return h
			}
		}
		t.Fatalf("no row for host %d", slot)
		return clusterdb.Host{}
	}
	var why []string
	for range 3 {
		// Room for n more after the parent: (n+1)·mem <= free < (n+2)·mem,
		// with mem = free/(n+1.5) on the fullest eu host.
		var free int64 = -1
		for _, h := range c.Hosts {
			if h.Region == "eu" {
				row := hostRow(h.N)
				if f := row.MemTotalMB - placement.Reserve - row.MemAllocMB; free < 0 || f < free {
					free = f
				}
			}
		}
		mem := free * 2 / (2*n + 3)
		parent := create(t, "eu", map[string]any{"memoryMB": mem})
		created := time.Now()
		a := hostOf(t, parent)
		// A heartbeat of its host after the create answered (its host
		// counts it then), and the gateway's next read of the rows
		// (every second).
		eventually(t, 10*time.Second, fmt.Sprintf("a heartbeat of host %d", a.N), func() bool { return hostRow(a.N).UpdatedAt.After(created) })
		time.Sleep(1500 * time.Millisecond)
		row := hostRow(a.N)
		room := (row.MemTotalMB - placement.Reserve - row.MemAllocMB) / mem
		if room == n {
			t.Logf("parent %s of %d MiB on host %d: %d MiB allocated of %d, room for %d more", parent.ID, mem, a.N, row.MemAllocMB, row.MemTotalMB, room)
			return parent, a
		}
		why = append(why, fmt.Sprintf("%d MiB on host %d: room for %d (%d of %d allocated)", mem, a.N, room, row.MemAllocMB, row.MemTotalMB))
		do(t, "eu", "DELETE", "/sandboxes/"+parent.ID, nil, nil)
		time.Sleep(3 * time.Second) // its release in the rows and the gateway's view
	}
	t.Fatalf("no parent whose host has room for %d more: %v", n, why)
	return sandbox{}, nil
}

// testForkPeerUnreachable: a fork beyond the parent's host whose other
// host cannot reach the parent's (a route that refuses it): the children
// there import the image from the store instead, once the upload has put
// it there, with the parent's exact state; the host says why.
func testForkPeerUnreachable(t *testing.T) {
	parent := create(t, "eu", map[string]any{"memoryMB": 8192})
	a := hostOf(t, parent)
	if out, status := runCode(t, "eu", parent, `z = "from the parent"; print(z)`); out != "from the parent\n" {
		t.Fatalf("setting state up: %d %q", status, out)
	}
	// Every other host of the region (the suite may have added one) is
	// cut off from the parent's, so a child lands on one that cannot
	// reach it wherever the gateway places it.
	ip, _, _ := strings.Cut(a.Addr, ":")
	others := map[int]*harness.Host{}
	before := map[int]int{}
	for _, h := range c.Hosts {
		if h.Region != "eu" || h.N == a.N {
			continue
		}
		route := []string{"-n", h.NS, "route", "add", "prohibit", ip + "/32"}
		if out, err := exec.Command("ip", route...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", route, err, out)
		}
		ns := h.NS
		t.Cleanup(func() { _ = exec.Command("ip", "-n", ns, "route", "del", "prohibit", ip+"/32").Run() })
		others[h.N] = h
		before[h.N] = strings.Count(h.Logs(), `msg="image imported from a peer"`)
	}
	// Room for a child on another host, whatever the tests before left
	// there until their kills (or a restarted host's return) reach the
	// gateway's view; and the gateway may not count the parent on its
	// host yet (that comes with the host's next heartbeat) and find room
	// there for both. A fork with no child elsewhere is killed and tried
	// again.
	var r resp
	var results []struct {
		Sandbox *sandbox `json:"sandbox"`
		Error   any      `json:"error"`
	}
	eventually(t, 90*time.Second, fmt.Sprintf("a fork(2) with a child on a host other than %d", a.N), func() bool {
		r = do(t, "eu", "POST", "/sandboxes/"+parent.ID+"/fork", map[string]any{"count": 2, "timeout": 60}, nil)
		if r.status != 201 {
			t.Fatalf("fork: %d %s", r.status, r.body)
		}
		results = nil
		r.json(t, &results)
		ok, away := len(results) == 2, false
		for _, res := range results {
			ok = ok && res.Sandbox != nil
			away = away || res.Sandbox != nil && hostOf(t, *res.Sandbox).N != a.N
		}
		if ok = ok && away; !ok {
			t.Logf("fork again: %s", r.body)
			for _, res := range results {
				if res.Sandbox != nil {
					do(t, "eu", "DELETE", "/sandboxes/"+res.Sandbox.ID, nil, nil)
				}
			}
			time.Sleep(2 * time.Second)
		}
		return ok
	})
	elsewhere := map[int]bool{}
	for i, res := range results {
		child := *res.Sandbox
		t.Cleanup(func() { do(t, "eu", "DELETE", "/sandboxes/"+child.ID, nil, nil) })
		if n := hostOf(t, child).N; n != a.N {
			elsewhere[n] = true
		}
		if out, status := runCode(t, "eu", child, "print(z)"); out != "from the parent\n" {
			t.Errorf("child %d (%s): %d %q", i, child.ID, status, out)
		}
	}
	t.Logf("children on hosts %v, which cannot reach host %d; Server-Timing %s", elsewhere, a.N, r.header.Get("Server-Timing"))
	for n := range elsewhere {
		var fetched []string
		for _, line := range strings.Split(others[n].Logs(), "\n") {
			if strings.Contains(line, `msg="image imported from a peer"`) {
				fetched = append(fetched, line)
			}
		}
		if len(fetched) <= before[n] {
			t.Fatalf("host %d logged no import through the parent's host", n)
		}
		// Every object from the store (or, for a second child, the
		// host's cache), none from the peer, and the host says why.
		fromStore := 0
		for _, line := range fetched[before[n]:] {
			if !strings.Contains(line, " peer_objects=0 ") {
				t.Errorf("host %d imported from the parent's host it cannot reach: %s", n, line)
			}
			if !strings.Contains(line, " store_objects=0 ") {
				fromStore++
				if strings.Contains(line, `peer_error=""`) {
					t.Errorf("host %d read the store without saying why: %s", n, line)
				}
			}
		}
		if fromStore == 0 {
			t.Errorf("host %d read nothing from the store: %v", n, fetched[before[n]:])
		}
	}
}

// hostLists reports whether host h runs sandbox id (asked directly, as a
// gateway asks).
func hostLists(t *testing.T, h *harness.Host, id string) bool {
	t.Helper()
	ids, ok := listed(t, h)
	if !ok {
		t.Fatalf("listing host %d: it does not answer", h.N)
	}
	return slices.Contains(ids, id)
}

// testStoreOutage: the S3 server stops while a paused sandbox's image
// uploads and while another host imports it. The pause (to disk) answers anyway;
// with the image only on its host, that host dying leaves the sandbox
// waiting for it (a clear 503, nothing moved), and it resumes there when
// the host is back; the upload finishes once the store is back; an import
// that meets the outage fails clearly, and the resume retried after the
// store is back finds the sandbox, its state whole, on the new host.
func testStoreOutage(t *testing.T) {
	ctx := context.Background()
	sb := create(t, "eu", nil)
	a := hostOf(t, sb)
	if out, status := runCode(t, "eu", sb, `w = 17; open("/tmp/outage.txt", "w").write("kept"); print(w)`); out != "17\n" {
		t.Fatalf("setting state up: %d %q", status, out)
	}
	running := true
	defer func() {
		c.S3.Start()
		if !running {
			if err := a.Start(); err != nil {
				t.Errorf("starting host %d again: %v", a.N, err)
			}
		}
	}()
	db := openDB(t)
	defer db.Close()

	// The export meets the outage: the pause answers, the row waits.
	c.S3.Stop()
	if r := do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/pause", map[string]any{"spill": true}, nil); r.status != 204 {
		t.Fatalf("pause with the store down: %d %s", r.status, r.body)
	}
	eventually(t, 10*time.Second, "the paused row", func() bool {
		row, err := db.GetSandbox(ctx, sb.ID)
		return err == nil && row.State == "paused"
	})
	// Its host dies before the upload: nothing else can resume it.
	a.Kill()
	running = false
	eventually(t, 30*time.Second, "a resume to say the sandbox waits for its host", func() bool {
		r := do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120}, nil)
		return r.status == 503 && strings.Contains(string(r.body), "had not reached the chunk store")
	})
	if row, err := db.GetSandbox(ctx, sb.ID); err != nil || row.HostSlot != a.N || row.State != "paused" || row.StoreRoot != "" {
		t.Fatalf("row while its host is down: %+v %v", row, err)
	}
	// Back (the store still down), the host resumes it from its own disk.
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	running = true
	var r resp
	eventually(t, 40*time.Second, "the sandbox to resume on its own host", func() bool {
		r = do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120}, nil)
		return r.status/100 == 2
	})
	if out, status := runCode(t, "eu", sb, `print(w, open("/tmp/outage.txt").read())`); out != "17 kept\n" {
		t.Fatalf("state on its own host: %d %q", status, out)
	}
	if h := hostOf(t, sb); h.N != a.N {
		t.Fatalf("resumed on host %d, not its own %d", h.N, a.N)
	}

	// Paused again; the upload retries until the store is back.
	if r := do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/pause", map[string]any{"spill": true}, nil); r.status != 204 {
		t.Fatalf("second pause: %d %s", r.status, r.body)
	}
	time.Sleep(3 * time.Second)
	if row, err := db.GetSandbox(ctx, sb.ID); err != nil || row.StoreRoot != "" {
		t.Fatalf("row says uploaded with the store down: %+v %v", row, err)
	}
	if err := c.S3.Start(); err != nil {
		t.Fatal(err)
	}
	pausedInStore(t, sb.ID)

	// The import meets the outage: a clear error, the sandbox kept.
	a.Kill()
	running = false
	c.S3.Stop()
	eventually(t, 60*time.Second, "a resume elsewhere to fail on the store", func() bool {
		r = do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120}, nil)
		if r.status/100 == 2 {
			t.Fatalf("resumed with the store down: %s", r.header.Get("Server-Timing"))
		}
		return r.status == 503 && strings.Contains(string(r.body), "store")
	})
	t.Logf("the import's error: %s", r.body)
	row, err := db.GetSandbox(ctx, sb.ID)
	if err != nil || row.HostSlot == a.N || row.State != "paused" || row.StoreRoot == "" {
		t.Fatalf("row after the failed import: %+v %v", row, err)
	}
	if err := c.S3.Start(); err != nil {
		t.Fatal(err)
	}
	if r = do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120}, nil); r.status/100 != 2 {
		t.Fatalf("resume once the store is back: %d %s", r.status, r.body)
	}
	if out, status := runCode(t, "eu", sb, `print(w, open("/tmp/outage.txt").read())`); out != "17 kept\n" {
		t.Fatalf("state on the new host: %d %q", status, out)
	}
	rowsIntact(t)
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	running = true
	do(t, "eu", "DELETE", "/sandboxes/"+sb.ID, nil, nil)
}

// storeUse is what the cluster's chunk store holds: its manifests and
// chunk and pack objects, and their bytes.
func storeUse(t *testing.T) (manifests, chunks int, bytes int64) {
	t.Helper()
	err := filepath.WalkDir(c.StoreDir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // collected while we walked
		}
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		switch rel, _ := filepath.Rel(c.StoreDir, p); {
		case strings.HasPrefix(rel, "manifests/"):
			manifests++
		case strings.HasPrefix(rel, "chunks/"), strings.HasPrefix(rel, "packs/"):
			chunks++ // a chunk, or a pack of them (s3:// stores)
		default:
			return nil
		}
		bytes += info.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return manifests, chunks, bytes
}

// testStoreCollects: the hosts share the chunk store and one of them
// collects it (each round claimed in the database) with the cluster's
// rows as the live roots: a deleted snapshot's and a killed paused
// sandbox's unique chunks go once the grace period is over, while what
// another host's rows still name stays.
func testStoreCollects(t *testing.T) {
	sb := create(t, "eu", nil)
	// 8 MiB no other image has, in memory and on disk.
	if out, status := runCode(t, "eu", sb, `import os; blob = os.urandom(8 << 20); open("/tmp/blob", "wb").write(blob); print(len(blob))`); out != "8388608\n" {
		t.Fatalf("setting state up: %d %q", status, out)
	}
	r := do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/snapshots", nil, nil)
	if r.status != 201 {
		t.Fatalf("snapshot: %d %s", r.status, r.body)
	}
	var sn struct {
		ID string `json:"snapshotID"`
	}
	r.json(t, &sn)
	waitUploaded(t, sn.ID)
	if r := do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/pause", nil, nil); r.status != 204 {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	pausedInStore(t, sb.ID)
	rowsIntact(t) // the snapshot's and the paused sandbox's images, through collections
	m0, c0, b0 := storeUse(t)

	// The paused sandbox's row keeps its image whole.
	if r := do(t, "eu", "DELETE", "/snapshots/"+sn.ID, nil, nil); r.status != 204 {
		t.Fatalf("deleting the snapshot: %d %s", r.status, r.body)
	}
	time.Sleep(storeGCGrace + 3*storeGCInterval)
	m1, c1, b1 := storeUse(t)
	if m1 >= m0 {
		t.Errorf("the deleted snapshot's manifest stayed: %d manifests, %d before", m1, m0)
	}
	rowsIntact(t)
	// Killed, the paused sandbox names nothing: its chunks go.
	if r := do(t, "eu", "DELETE", "/sandboxes/"+sb.ID, nil, nil); r.status != 204 {
		t.Fatalf("kill: %d %s", r.status, r.body)
	}
	var m2, c2 int
	var b2 int64
	eventually(t, storeGCGrace+10*storeGCInterval, "the killed sandbox's chunks to be collected", func() bool {
		m2, c2, b2 = storeUse(t)
		return b1-b2 >= 8<<20
	})
	time.Sleep(2 * storeGCInterval) // the round that got there has finished its sweep
	m2, c2, b2 = storeUse(t)
	t.Logf("chunk store: %d manifests, %d chunks, %d bytes with the snapshot and the paused sandbox; %d, %d, %d after the snapshot's deletion; %d, %d, %d after the kill",
		m0, c0, b0, m1, c1, b1, m2, c2, b2)
	rowsIntact(t)
}

// rowsIntact checks that every manifest the cluster's rows name is in the
// store with all its chunks.
func rowsIntact(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	db := openDB(t)
	defer db.Close()
	roots, err := db.StoreRoots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := chunkstore.Open(ctx, c.Store, chunkstore.Options{S3: c.S3.Config()})
	if err != nil {
		t.Fatal(err)
	}
	for _, root := range roots {
		h, err := chunkstore.ParseHash(root)
		if err != nil {
			t.Fatalf("root %q: %v", root, err)
		}
		m, err := s.Manifest(ctx, h)
		if err != nil {
			var names []string
			rows, _ := db.Pool().Query(ctx, `SELECT 'sandbox ' || id || ' ' || state || ' on ' || host_slot FROM sandboxes WHERE store_root = $1
				UNION ALL SELECT 'snapshot ' || id || ' on ' || host_slot FROM snapshots WHERE store_root = $1`, root)
			for rows.Next() {
				var n string
				_ = rows.Scan(&n)
				names = append(names, n)
			}
			rows.Close()
			t.Errorf("a manifest %v name: %v", names, err)
			logsAbout(t, append(names, root[:16])...)
			continue
		}
		// The S3 server keeps each object as a file under StoreDir: a stat
		// each, not a request each (the built-in template's artifact
		// alone names 46,000 chunks). Each chunk's object is its own or
		// its pack (s3:// stores write pack files).
		seen := map[string]bool{}
		for _, h := range m.Hashes() {
			k, _ := chunkstoretest.StoredAt(m, h)
			if seen[k] {
				continue
			}
			seen[k] = true
			if _, err := os.Stat(filepath.Join(c.StoreDir, k)); err != nil {
				t.Errorf("manifest %s names chunk or pack %s, which is not in the store: %v", root, k, err)
			}
		}
	}
}

// logsAbout logs the cluster's log lines that mention any of words (ids,
// roots), to say in CI how a row came to name what it does.
func logsAbout(t *testing.T, words ...string) {
	t.Helper()
	var keys []string
	for _, w := range words {
		for _, f := range strings.Fields(w) {
			if len(f) >= 16 && !strings.ContainsAny(f, " ") {
				keys = append(keys, f)
			}
		}
	}
	n := 0
	for _, h := range c.Hosts {
		for _, line := range strings.Split(h.Logs(), "\n") {
			for _, k := range keys {
				if strings.Contains(line, k) && !strings.Contains(line, "msg=request ") {
					if n++; n <= 60 {
						t.Logf("host %d: %s", h.N, line)
					}
					break
				}
			}
		}
	}
}
