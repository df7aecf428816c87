package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/cellfork/cellfork/internal/api/apitypes"
)

func TestSnapshotCreate(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "snapshot", "create", "sbx1", "--name", "ready")
	if code != 0 || out != "snapA\n" {
		t.Fatalf("got code %d stdout %q stderr %q", code, out, errOut)
	}
	r := d.last("POST", "/sandboxes/sbx1/snapshots")
	if r.Body != `{"name":"ready"}` || r.Header.Get("X-API-KEY") != testKey || r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("body %s headers %v", r.Body, r.Header)
	}

	code, out, _ = d.run(context.Background(), "", "--json", "snapshot", "create", "sbx1")
	if r := d.last("POST", "/sandboxes/sbx1/snapshots"); r.Body != `{}` {
		t.Errorf("body without --name %s", r.Body)
	}
	var sn map[string]any
	if err := json.Unmarshal([]byte(out), &sn); code != 0 || err != nil || sn["snapshotID"] != "snapA" || sn["sizeBytes"] != 1536.0 {
		t.Errorf("--json: code %d out %q err %v", code, out, err)
	}

	code, out, errOut = d.run(context.Background(), "", "snapshot", "create", "missing")
	if code != 1 || out != "" || errOut != "cellfork: sandbox missing not found (request req-POST)\n" {
		t.Errorf("missing sandbox: code %d stdout %q stderr %q", code, out, errOut)
	}
}

func snapJSON(id, parent, sandbox string, size int64, names ...string) string {
	p := "null"
	if parent != "" {
		p = `"` + parent + `"`
	}
	n, _ := json.Marshal(append([]string{}, names...))
	return fmt.Sprintf(`{"snapshotID":%q,"names":%s,"parentID":%s,"sandboxID":%q,"templateID":"base","sizeBytes":%d,"createdAt":"2026-08-22T10:00:00.123456789Z"}`,
		id, n, p, sandbox, size)
}

func TestSnapshotList(t *testing.T) {
	d := newFakeDaemon(t)
	d.snaps = []listPage{
		{Body: "[" + strings.Replace(snapJSON("snapRoot", "", "sbx1", 300<<20, "base-ready"), "}", `,"uploadState":"uploaded"}`, 1) + "]", Next: "tok1"},
		{Body: "[" + snapJSON("snapB", "snapRoot", "sbx2", 1536, "v1", "v2") + "," + snapJSON("snapC", "snapB", "", 10) + "]"},
	}
	code, out, errOut := d.run(context.Background(), "", "snapshot", "list", "--sandbox", "sbx 1", "--name", "a&b")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "ID        NAMES       PARENT    SANDBOX  SIZE       STORE     CREATED\n" +
		"snapRoot  base-ready  -         sbx1     300.0 MiB  uploaded  2026-08-22T10:00:00Z\n" +
		"snapB     v1,v2       snapRoot  sbx2     1.5 KiB    -         2026-08-22T10:00:00Z\n" +
		"snapC     -           snapB     -        10 B       -         2026-08-22T10:00:00Z\n"
	if out != want {
		t.Errorf("table:\n%s\nwant:\n%s", out, want)
	}
	r := d.last("GET", "/snapshots")
	q, _ := url.ParseQuery(r.Query)
	if q.Get("sandboxID") != "sbx 1" || q.Get("name") != "a&b" || q.Get("nextToken") != "tok1" || len(q) != 3 {
		t.Errorf("query %q", r.Query)
	}

	code, out, _ = d.run(context.Background(), "", "snapshot", "ls", "--json")
	var items []apitypes.Snapshot
	if err := json.Unmarshal([]byte(out), &items); code != 0 || err != nil || len(items) != 3 || parentOf(&items[2]) != "snapB" {
		t.Errorf("--json: code %d out %q err %v", code, out, err)
	}
	if q := d.last("GET", "/snapshots").Query; q != "nextToken=tok1" {
		t.Errorf("unfiltered query %q", q)
	}
}

func TestSnapshotListEmpty(t *testing.T) {
	d := newFakeDaemon(t)
	d.snaps = []listPage{{Body: `[]`}}
	code, out, _ := d.run(context.Background(), "", "snapshot", "list", "--json")
	if code != 0 || out != "[]\n" {
		t.Errorf("--json: code %d out %q", code, out)
	}
	code, out, _ = d.run(context.Background(), "", "snapshot", "list")
	if code != 0 || out != "ID  NAMES  PARENT  SANDBOX  SIZE  STORE  CREATED\n" {
		t.Errorf("table: code %d out %q", code, out)
	}
}

func TestSnapshotGet(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "snapshot", "get", "ready")
	want := "ID     NAMES     PARENT    SANDBOX  SIZE     STORE  CREATED\n" +
		"snapA  ready,v1  snapRoot  sbx1     2.0 KiB  -      2026-08-22T10:00:00Z\n"
	if code != 0 || out != want {
		t.Errorf("code %d stdout %q stderr %q", code, out, errOut)
	}
	d.last("GET", "/snapshots/ready")
	code, _, errOut = d.run(context.Background(), "", "snapshot", "get", "missing")
	if code != 1 || !strings.Contains(errOut, "snapshot missing not found") {
		t.Errorf("missing: code %d stderr %q", code, errOut)
	}
}

// treeJSON: what GET /snapshots/tree answers for root r with children a
// (child c) and b, plus o whose parent is gone.
func treeJSON() string {
	node := func(snap string, children ...string) string {
		return snap[:len(snap)-1] + `,"children":[` + strings.Join(children, ",") + "]}"
	}
	return "[" + node(snapJSON("snapR", "", "sbx1", 100<<20, "base"),
		node(snapJSON("snapA", "snapR", "sbx1", 2<<20, "a1", "a2"), node(snapJSON("snapC", "snapA", "sbx3", 4<<20, "deep"))),
		node(snapJSON("snapB", "snapR", "sbx2", 3<<20))) +
		"," + node(snapJSON("snapO", "snapGone", "sbx9", 512)) + "]"
}

func TestSnapshotTree(t *testing.T) {
	d := newFakeDaemon(t)
	d.tree = treeJSON()
	code, out, errOut := d.run(context.Background(), "", "snapshot", "tree")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "" +
		"SNAPSHOT       NAMES  SIZE       SANDBOX\n" +
		"snapR          base   100.0 MiB  sbx1\n" +
		"├── snapA      a1,a2  2.0 MiB    sbx1\n" +
		"│   └── snapC  deep   4.0 MiB    sbx3\n" +
		"└── snapB      -      3.0 MiB    sbx2\n" +
		"snapO          -      512 B      sbx9  (parent snapGone gone)\n"
	if out != want {
		t.Errorf("tree:\n%s\nwant:\n%s", out, want)
	}
	d.last("GET", "/snapshots/tree")

	// --json prints the daemon's tree as it is.
	code, out, _ = d.run(context.Background(), "", "snapshot", "tree", "--json")
	var got, sent any
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil {
		t.Fatalf("--json: code %d out %q err %v", code, out, err)
	}
	json.Unmarshal([]byte(d.tree), &sent)
	if !reflect.DeepEqual(got, sent) {
		t.Errorf("--json tree %s, want the daemon's %s", out, d.tree)
	}

	d.tree = `[]`
	code, out, _ = d.run(context.Background(), "", "snapshot", "tree")
	if code != 0 || out != "SNAPSHOT  NAMES  SIZE  SANDBOX\n" {
		t.Errorf("empty tree: code %d out %q", code, out)
	}
	d.tree = `{"not":"a list"}`
	if code, _, errOut = d.run(context.Background(), "", "snapshot", "tree"); code != 1 || !strings.Contains(errOut, "decoding snapshot tree") {
		t.Errorf("bad answer: code %d stderr %q", code, errOut)
	}
}

func TestSnapshotRemove(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "snapshot", "rm", "snapA", "missing", "ready")
	if code != 1 || out != "snapA\nready\n" || errOut != "cellfork: snapshot missing not found (request req-DELETE)\n" {
		t.Errorf("code %d stdout %q stderr %q", code, out, errOut)
	}
	d.last("DELETE", "/snapshots/snapA")
	d.last("DELETE", "/snapshots/ready")

	code, out, _ = d.run(context.Background(), "", "snapshot", "rm", "--json", "snapA", "missing")
	var res []struct {
		SnapshotID string `json:"snapshotID"`
		Deleted    bool   `json:"deleted"`
		Error      string `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 1 || len(res) != 2 ||
		!res[0].Deleted || res[1].Deleted || res[1].Error == "" || res[1].SnapshotID != "missing" {
		t.Errorf("--json: code %d out %q err %v", code, out, err)
	}
	code, _, _ = d.run(context.Background(), "", "snapshot", "rm", "snapA")
	if code != 0 {
		t.Errorf("exit %d", code)
	}
}

func TestSnapshotUsage(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, _ := d.run(context.Background(), "", "snapshot", "usage")
	if code != 0 || out != "3 snapshots, 3.0 GiB of 20.0 GiB cap (15.0%)\n" {
		t.Errorf("code %d out %q", code, out)
	}
	code, out, _ = d.run(context.Background(), "", "snapshot", "usage", "--json")
	var u apitypes.SnapshotUsage
	if err := json.Unmarshal([]byte(out), &u); code != 0 || err != nil || u.Count != 3 || u.CapBytes != 20<<30 {
		t.Errorf("--json: code %d out %q err %v", code, out, err)
	}
	if got := formatUsage(apitypes.SnapshotUsage{TotalBytes: 0, Count: 1}); got != "1 snapshot, 0 B (no cap)" {
		t.Errorf("no cap: %q", got)
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 20: "5.0 MiB",
		3 << 30: "3.0 GiB", 2 << 40: "2.0 TiB", 4096 << 40: "4096.0 TiB",
	} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestSandboxCreateFromSnapshot(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "sandbox", "create", "--snapshot", "ready", "--timeout", "30")
	if code != 0 || out != "sbx1\n" {
		t.Fatalf("code %d stdout %q stderr %q", code, out, errOut)
	}
	if r := d.last("POST", "/v2/sandboxes"); r.Body != `{"templateID":"ready","timeout":30}` {
		t.Errorf("body %s", r.Body)
	}
}
