package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
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
		{Body: "[" + snapJSON("snapRoot", "", "sbx1", 300<<20, "base-ready") + "]", Next: "tok1"},
		{Body: "[" + snapJSON("snapB", "snapRoot", "sbx2", 1536, "v1", "v2") + "," + snapJSON("snapC", "snapB", "", 10) + "]"},
	}
	code, out, errOut := d.run(context.Background(), "", "snapshot", "list", "--sandbox", "sbx 1", "--name", "a&b")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "ID        NAMES       PARENT    SANDBOX  SIZE       CREATED\n" +
		"snapRoot  base-ready  -         sbx1     300.0 MiB  2026-08-22T10:00:00Z\n" +
		"snapB     v1,v2       snapRoot  sbx2     1.5 KiB    2026-08-22T10:00:00Z\n" +
		"snapC     -           snapB     -        10 B       2026-08-22T10:00:00Z\n"
	if out != want {
		t.Errorf("table:\n%s\nwant:\n%s", out, want)
	}
	r := d.last("GET", "/snapshots")
	q, _ := url.ParseQuery(r.Query)
	if q.Get("sandboxID") != "sbx 1" || q.Get("name") != "a&b" || q.Get("nextToken") != "tok1" || len(q) != 3 {
		t.Errorf("query %q", r.Query)
	}

	code, out, _ = d.run(context.Background(), "", "snapshot", "ls", "--json")
	var items []snapshotInfo
	if err := json.Unmarshal([]byte(out), &items); code != 0 || err != nil || len(items) != 3 || items[2].parent() != "snapB" {
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
	if code != 0 || out != "ID  NAMES  PARENT  SANDBOX  SIZE  CREATED\n" {
		t.Errorf("table: code %d out %q", code, out)
	}
}

func TestSnapshotGet(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "snapshot", "get", "ready")
	want := "ID     NAMES     PARENT    SANDBOX  SIZE     CREATED\n" +
		"snapA  ready,v1  snapRoot  sbx1     2.0 KiB  2026-08-22T10:00:00Z\n"
	if code != 0 || out != want {
		t.Errorf("code %d stdout %q stderr %q", code, out, errOut)
	}
	d.last("GET", "/snapshots/ready")
	code, _, errOut = d.run(context.Background(), "", "snapshot", "get", "missing")
	if code != 1 || !strings.Contains(errOut, "snapshot missing not found") {
		t.Errorf("missing: code %d stderr %q", code, errOut)
	}
}

// treeFixture: root r with children a (child c) and b, plus o whose parent
// was never listed.
func treeFixture() []listPage {
	return []listPage{
		{Body: "[" + strings.Join([]string{
			snapJSON("snapR", "", "sbx1", 100<<20, "base"),
			snapJSON("snapA", "snapR", "sbx1", 2<<20, "a1", "a2"),
			snapJSON("snapO", "snapGone", "sbx9", 512),
		}, ",") + "]", Next: "t1"},
		{Body: "[" + strings.Join([]string{
			snapJSON("snapB", "snapR", "sbx2", 3<<20),
			snapJSON("snapC", "snapA", "sbx3", 4<<20, "deep"),
		}, ",") + "]"},
	}
}

func TestSnapshotTree(t *testing.T) {
	d := newFakeDaemon(t)
	d.snaps = treeFixture()
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
		"snapO          -      512 B      sbx9  (parent snapGone not listed)\n"
	if out != want {
		t.Errorf("tree:\n%s\nwant:\n%s", out, want)
	}

	code, out, _ = d.run(context.Background(), "", "snapshot", "tree", "--json")
	type node struct {
		SnapshotID string `json:"snapshotID"`
		SizeBytes  int64  `json:"sizeBytes"`
		Children   []node `json:"children"`
	}
	var roots []node
	if err := json.Unmarshal([]byte(out), &roots); code != 0 || err != nil {
		t.Fatalf("--json: code %d out %q err %v", code, out, err)
	}
	var render func(ns []node) string
	render = func(ns []node) string {
		var b strings.Builder
		for _, n := range ns {
			fmt.Fprintf(&b, "%s(%s)", n.SnapshotID, render(n.Children))
		}
		return b.String()
	}
	if got := render(roots); got != "snapR(snapA(snapC())snapB())snapO()" || roots[0].SizeBytes != 100<<20 {
		t.Errorf("--json tree %s", got)
	}
	if !strings.Contains(out, `"children": []`) {
		t.Errorf("leaves should have an empty children array: %s", out)
	}
}

func TestBuildSnapshotTreeOddParents(t *testing.T) {
	// A cycle x -> y -> x hanging off nothing, a self-parent and a
	// duplicate: every snapshot is still shown exactly once.
	items := []json.RawMessage{
		json.RawMessage(snapJSON("x", "y", "s", 1)),
		json.RawMessage(snapJSON("y", "x", "s", 1)),
		json.RawMessage(snapJSON("self", "self", "s", 1)),
		json.RawMessage(snapJSON("x", "", "s", 1)),
	}
	roots, err := buildSnapshotTree(items)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := printSnapshotTree(&buf, roots); err != nil {
		t.Fatal(err)
	}
	want := "SNAPSHOT  NAMES  SIZE  SANDBOX\n" +
		"self      -      1 B   s  (its own parent)\n" +
		"x         -      1 B   s  (parent cycle via y)\n" +
		"└── y     -      1 B   s\n"
	if buf.String() != want {
		t.Errorf("tree:\n%s\nwant:\n%s", buf.String(), want)
	}
	if _, err := buildSnapshotTree([]json.RawMessage{json.RawMessage(`{"names":[]}`)}); err == nil {
		t.Error("a snapshot without an id was accepted")
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
	var u snapshotUsageInfo
	if err := json.Unmarshal([]byte(out), &u); code != 0 || err != nil || u.Count != 3 || u.CapBytes != 20<<30 {
		t.Errorf("--json: code %d out %q err %v", code, out, err)
	}
	if got := formatUsage(snapshotUsageInfo{TotalBytes: 0, Count: 1}); got != "1 snapshot, 0 B (no cap)" {
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
	if r := d.last("POST", "/v2/sandboxes"); r.Body != `{"templateID":"ready","timeout":30,"metadata":{},"envVars":{}}` {
		t.Errorf("body %s", r.Body)
	}
}
