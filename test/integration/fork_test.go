package integration

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// state is what "exact" means for a sandbox: a REPL variable, files
// written anywhere, a background process with its pid, and a TCP server.
type state struct {
	value string
	pid   string
}

// seed puts a known state into sb and returns it.
func seed(t *testing.T, sb sandboxInfo, value string) state {
	t.Helper()
	ev := runCode(t, sb, fmt.Sprintf("marker = %q\nprint(marker)", value))
	if stdoutOf(ev) != value+"\n" {
		t.Fatalf("seeding REPL: %v", ev)
	}
	run(t, sb, "root", fmt.Sprintf("echo %s > /etc/cellfork-marker", value))
	out, _, _ := run(t, sb, "", fmt.Sprintf("echo %s > /home/user/marker.txt; nohup sleep 100000 >/dev/null 2>&1 & echo $!", value))
	pid := strings.TrimSpace(out)
	run(t, sb, "", "cd /home/user && nohup python3 -m http.server 8000 >/dev/null 2>&1 &")
	eventually(t, 15*time.Second, "the TCP server to listen", func() bool { return serve(t, sb) == 200 })
	return state{value: value, pid: pid}
}

// serve fetches / from the sandbox's port 8000 through the daemon.
func serve(t *testing.T, sb sandboxInfo) int {
	t.Helper()
	return dataCall(t, "GET", "/marker.txt", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "8000"}, nil).status
}

// check asserts sb holds exactly st.
func check(t *testing.T, sb sandboxInfo, st state) {
	t.Helper()
	if got := stdoutOf(runCode(t, sb, "print(marker)")); got != st.value+"\n" {
		t.Errorf("%s: REPL variable = %q, want %q", sb.SandboxID, got, st.value)
	}
	out, _, _ := run(t, sb, "", "cat /etc/cellfork-marker /home/user/marker.txt; cat /proc/"+st.pid+"/cmdline | tr '\\0' ' '")
	want := st.value + "\n" + st.value + "\nsleep 100000 "
	if out != want {
		t.Errorf("%s: files and process = %q, want %q", sb.SandboxID, out, want)
	}
	r := dataCall(t, "GET", "/marker.txt", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "8000"}, nil)
	if r.status != 200 || string(r.body) != st.value+"\n" {
		t.Errorf("%s: TCP server answered %d %q", sb.SandboxID, r.status, r.body)
	}
}

// mutate changes every part of the state to value.
func mutate(t *testing.T, sb sandboxInfo, value string) {
	t.Helper()
	runCode(t, sb, fmt.Sprintf("marker = %q", value))
	run(t, sb, "root", fmt.Sprintf("echo %s > /etc/cellfork-marker; echo %s > /home/user/marker.txt", value, value))
}

func info(t *testing.T, id string) map[string]any {
	t.Helper()
	r := call(t, "GET", "/sandboxes/"+id, nil)
	if r.status != 200 {
		t.Fatalf("get %s: %d %s", id, r.status, r.body)
	}
	var m map[string]any
	r.json(t, &m)
	return m
}

func TestCreateIsWarm(t *testing.T) {
	sb := create(t, nil)
	if mode := info(t, sb.SandboxID)["bootMode"]; mode != "pool" && mode != "restore" {
		t.Errorf("bootMode %v: the warm image was not used", mode)
	}
	start := time.Now()
	ev := runCode(t, sb, "import pandas, numpy, matplotlib.pyplot\nprint('ok')")
	if stdoutOf(ev) != "ok\n" || time.Since(start) > 2*time.Second {
		t.Errorf("pre-imported modules: %v after %v", ev, time.Since(start))
	}
}

func snapshotOf(t *testing.T, id, name string) string {
	t.Helper()
	body := map[string]any{}
	if name != "" {
		body["name"] = name
	}
	r := call(t, "POST", "/sandboxes/"+id+"/snapshots", body)
	if r.status != http.StatusCreated {
		t.Fatalf("snapshot: %d %s", r.status, r.body)
	}
	var sn struct {
		SnapshotID string   `json:"snapshotID"`
		Names      []string `json:"names"`
	}
	r.json(t, &sn)
	t.Cleanup(func() {
		callWith(t, "DELETE", "/templates/"+sn.SnapshotID, nil, map[string]string{"X-API-KEY": apiKey})
	})
	return sn.SnapshotID
}

func TestSnapshotCreateFromSnapshot(t *testing.T) {
	parent := create(t, map[string]any{"envVars": map[string]string{"FROM": "parent"}})
	st := seed(t, parent, "snap-1")
	name := fmt.Sprintf("itest-%d", time.Now().UnixNano())
	sid := snapshotOf(t, parent.SandboxID, name)
	check(t, parent, st) // the parent keeps running, unchanged

	var child sandboxInfo
	for _, tmpl := range []string{sid, name} { // by id and by name
		child = create(t, map[string]any{"templateID": tmpl})
		check(t, child, st)
		if out, _, _ := run(t, child, "", "echo $FROM"); out != "parent\n" {
			t.Errorf("env vars not inherited from the snapshot: %q", out)
		}
		// Independence: the child diverges, the parent does not see it.
		mutate(t, child, "child")
		check(t, parent, st)
	}

	r := call(t, "GET", "/snapshots?sandboxID="+parent.SandboxID, nil)
	if r.status != 200 || !strings.Contains(string(r.body), sid) || !strings.Contains(string(r.body), name) {
		t.Errorf("list snapshots: %d %s", r.status, r.body)
	}
	// A name moves to the newest snapshot that takes it (E2B semantics).
	mutate(t, parent, "snap-2")
	newer := snapshotOf(t, parent.SandboxID, name)
	var got struct {
		SnapshotID string `json:"snapshotID"`
	}
	call(t, "GET", "/snapshots/"+name, nil).json(t, &got)
	if got.SnapshotID != newer {
		t.Errorf("name %q points at %s, want the newer %s", name, got.SnapshotID, newer)
	}
	// The daemon's tree: the parent's newer snapshot hangs under the first.
	type node struct {
		SnapshotID string `json:"snapshotID"`
		Children   []node `json:"children"`
	}
	var find func([]node, string) *node
	find = func(ns []node, id string) *node {
		for i := range ns {
			if ns[i].SnapshotID == id {
				return &ns[i]
			}
			if n := find(ns[i].Children, id); n != nil {
				return n
			}
		}
		return nil
	}
	var roots []node
	call(t, "GET", "/snapshots/tree", nil).json(t, &roots)
	if n := find(roots, sid); n == nil || find(n.Children, newer) == nil {
		t.Errorf("snapshot tree %+v: %s does not hold %s", roots, sid, newer)
	}
	mutate(t, parent, st.value)
	for _, bad := range []string{"-x", "base", "usage", "tree", strings.Repeat("n", 200)} {
		if r := call(t, "POST", "/sandboxes/"+parent.SandboxID+"/snapshots", map[string]string{"name": bad}); r.status != 400 {
			t.Errorf("snapshot name %.20q: %d %s", bad, r.status, r.body)
		}
	}
	if r := call(t, "DELETE", "/templates/"+sid, nil); r.status != http.StatusNoContent {
		t.Fatalf("delete snapshot: %d %s", r.status, r.body)
	}
	if r := call(t, "DELETE", "/templates/"+sid, nil); r.status != 404 {
		t.Errorf("second delete: %d", r.status)
	}
	if base := info(t, child.SandboxID)["snapshotID"]; base == sid {
		t.Errorf("sandbox still based on the deleted snapshot %v", base)
	}
	if r := call(t, "POST", "/v2/sandboxes", map[string]any{"templateID": sid}); r.status != 404 {
		t.Errorf("create from a deleted snapshot: %d %s", r.status, r.body)
	}
}

func TestForkIsExactAndIndependent(t *testing.T) {
	parent := create(t, nil)
	st := seed(t, parent, "forked")
	r := call(t, "POST", "/sandboxes/"+parent.SandboxID+"/fork", map[string]any{"count": 3, "timeout": 120})
	if r.status != http.StatusCreated {
		t.Fatalf("fork: %d %s", r.status, r.body)
	}
	var results []struct {
		Sandbox *sandboxInfo `json:"sandbox"`
		Error   *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	r.json(t, &results)
	if len(results) != 3 {
		t.Fatalf("fork gave %d results", len(results))
	}
	var kids []sandboxInfo
	for _, res := range results {
		if res.Sandbox == nil {
			t.Fatalf("a child failed: %+v", res.Error)
		}
		kid := *res.Sandbox
		t.Cleanup(func() { killQuietly(kid.SandboxID) })
		kids = append(kids, kid)
		if p := info(t, kid.SandboxID)["parentSandboxID"]; p != parent.SandboxID {
			t.Errorf("child's parent = %v", p)
		}
	}
	for i, kid := range kids {
		check(t, kid, st)
		mutate(t, kid, fmt.Sprintf("kid-%d", i))
	}
	check(t, parent, st)
	for i, kid := range kids {
		if got := stdoutOf(runCode(t, kid, "print(marker)")); got != fmt.Sprintf("kid-%d\n", i) {
			t.Errorf("child %d sees %q: children are not independent", i, got)
		}
	}
	if r := call(t, "POST", "/sandboxes/"+parent.SandboxID+"/fork", map[string]any{"count": 0}); r.status != 400 {
		t.Errorf("fork count 0: %d", r.status)
	}
	if r := call(t, "POST", "/sandboxes/nosuchsandbox0000000/fork", map[string]any{"count": 1}); r.status != 404 {
		t.Errorf("fork of unknown sandbox: %d", r.status)
	}
}

func TestRollback(t *testing.T) {
	sb := create(t, nil)
	st := seed(t, sb, "v1")
	sid := snapshotOf(t, sb.SandboxID, "")
	mutate(t, sb, "v2")
	run(t, sb, "", "touch /home/user/created-after")

	r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/rollback", map[string]string{"snapshotID": sid})
	if r.status != 200 {
		t.Fatalf("rollback: %d %s", r.status, r.body)
	}
	check(t, sb, st) // same id, the snapshot's state
	if out, _, code := run(t, sb, "", "test -e /home/user/created-after"); code == 0 {
		t.Errorf("a file created after the snapshot survived the rollback: %q", out)
	}
	// Roll back again (a snapshot can be used many times).
	mutate(t, sb, "v3")
	if r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/rollback", map[string]string{"snapshotID": sid}); r.status != 200 {
		t.Fatalf("second rollback: %d %s", r.status, r.body)
	}
	check(t, sb, st)

	other := create(t, nil)
	otherSnap := snapshotOf(t, other.SandboxID, "")
	if r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/rollback", map[string]string{"snapshotID": otherSnap}); r.status != 409 {
		t.Errorf("rollback to another sandbox's tree: %d %s", r.status, r.body)
	}
	if r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/rollback", map[string]string{"snapshotID": "nosuchsnapshot"}); r.status != 404 {
		t.Errorf("rollback to unknown snapshot: %d %s", r.status, r.body)
	}
	check(t, sb, st) // failed rollbacks left it as it was
}

func TestPauseResume(t *testing.T) {
	sb := create(t, nil)
	st := seed(t, sb, "paused")
	for _, from := range []string{"memory", "disk"} {
		if r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{}); r.status != http.StatusNoContent {
			t.Fatalf("pause: %d %s", r.status, r.body)
		}
		if s := info(t, sb.SandboxID)["state"]; s != "paused" {
			t.Errorf("state %v after pause", s)
		}
		if r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{}); r.status != 409 {
			t.Errorf("second pause: %d", r.status)
		}
		if from == "disk" { // the test daemon spills after 1s
			time.Sleep(2500 * time.Millisecond)
		}
		r := call(t, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 120})
		if r.status != http.StatusCreated {
			t.Fatalf("resume from %s: %d %s", from, r.status, r.body)
		}
		check(t, sb, st)
		if r := call(t, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{}); r.status != 200 {
			t.Errorf("connect to a running sandbox: %d", r.status)
		}
	}
}

func TestMerge(t *testing.T) {
	parent := create(t, nil)
	seed(t, parent, "base")
	r := call(t, "POST", "/sandboxes/"+parent.SandboxID+"/fork", map[string]any{"count": 2})
	var results []struct {
		Sandbox *sandboxInfo `json:"sandbox"`
	}
	r.json(t, &results)
	if len(results) != 2 || results[0].Sandbox == nil || results[1].Sandbox == nil {
		t.Fatalf("fork: %s", r.body)
	}
	a, b := *results[0].Sandbox, *results[1].Sandbox
	t.Cleanup(func() { killQuietly(a.SandboxID); killQuietly(b.SandboxID) })
	mutate(t, a, "from-a")
	mutate(t, b, "from-b")

	if r := call(t, "POST", "/sandboxes/"+a.SandboxID+"/merge", map[string]string{"sandboxID": parent.SandboxID}); r.status != 409 {
		t.Errorf("merging a parent into its child: %d %s", r.status, r.body)
	}
	if r := call(t, "POST", "/sandboxes/"+parent.SandboxID+"/merge", map[string]string{"sandboxID": a.SandboxID}); r.status != 200 {
		t.Fatalf("merge: %d %s", r.status, r.body)
	}
	if got := stdoutOf(runCode(t, parent, "print(marker)")); got != "from-a\n" {
		t.Errorf("parent after merge: %q", got)
	}
	if r := call(t, "GET", "/sandboxes/"+a.SandboxID, nil); r.status != 404 {
		t.Errorf("merged child still exists: %d", r.status)
	}
	if got := stdoutOf(runCode(t, b, "print(marker)")); got != "from-b\n" {
		t.Errorf("other child changed: %q", got)
	}
}

// standbyOf says whether the snapshot's frozen standby is ready.
func standbyOf(t *testing.T, snapshotID string) bool {
	t.Helper()
	var h struct {
		Pool struct {
			Standbys map[string]int `json:"standbys"`
		} `json:"pool"`
	}
	call(t, "GET", "/health", nil).json(t, &h)
	return h.Pool.Standbys[snapshotID] == 1
}

// TestStandby: a snapshot rolled back to (or created from) once keeps a
// standby, restored and frozen at once; the next rollback or create
// resumes it. Its state is the snapshot's, not one that ran on meanwhile.
func TestStandby(t *testing.T) {
	sb := create(t, map[string]any{"timeout": 300})
	st := seed(t, sb, "standby")
	// A clock inside: it ticks every 50 ms while the sandbox runs.
	run(t, sb, "", "nohup bash -c 'i=0; while :; do i=$((i+1)); echo $i > /home/user/ticks; sleep 0.05; done' >/dev/null 2>&1 &")
	time.Sleep(300 * time.Millisecond)
	sid := snapshotOf(t, sb.SandboxID, "")
	ticks := func(sb sandboxInfo) int {
		out, _, _ := run(t, sb, "", "cat /home/user/ticks")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	atSnapshot := ticks(sb)

	mutate(t, sb, "after")
	if r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/rollback", map[string]string{"snapshotID": sid}); r.status != 200 {
		t.Fatalf("rollback: %d %s", r.status, r.body)
	}
	eventually(t, 30*time.Second, "the snapshot's standby", func() bool { return standbyOf(t, sid) })
	time.Sleep(time.Second) // a running copy would tick 20 times meanwhile

	mutate(t, sb, "after again")
	r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/rollback", map[string]string{"snapshotID": sid})
	if r.status != 200 {
		t.Fatalf("rollback onto the standby: %d %s", r.status, r.body)
	}
	if timing := r.header.Get("Server-Timing"); !strings.Contains(timing, "resume") || strings.Contains(timing, "restore") {
		t.Errorf("the rollback did not resume the standby: Server-Timing %q", timing)
	}
	check(t, sb, st)
	if got := ticks(sb); got > atSnapshot+10 {
		t.Errorf("the standby ran on while frozen: %d ticks, %d at the snapshot", got, atSnapshot)
	}

	// A create from the snapshot takes the standby the rollback left.
	eventually(t, 30*time.Second, "the standby to refill", func() bool { return standbyOf(t, sid) })
	child := create(t, map[string]any{"templateID": sid, "timeout": 300})
	if got := info(t, child.SandboxID)["bootMode"]; got != "standby" {
		t.Errorf("create from the snapshot: bootMode %v, want standby", got)
	}
	check(t, child, st)

	// Deleting the snapshot drops its standby.
	eventually(t, 30*time.Second, "the standby to refill", func() bool { return standbyOf(t, sid) })
	if r := call(t, "DELETE", "/templates/"+sid, nil); r.status != 204 {
		t.Fatalf("delete snapshot: %d %s", r.status, r.body)
	}
	var h struct {
		Pool struct {
			Standbys map[string]int `json:"standbys"`
		} `json:"pool"`
	}
	call(t, "GET", "/health", nil).json(t, &h)
	if _, ok := h.Pool.Standbys[sid]; ok {
		t.Errorf("a deleted snapshot keeps its standby entry: %v", h.Pool.Standbys)
	}
}
