package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testTemplatesTravel: a custom template built through a gateway (E2B's
// template API) on the region's template host is published to the chunk
// store; with that host cordoned, a create from it lands on another host,
// which pulls its layers and warm image: the files of its steps are there
// and its start command is serving. Another team does not see it; once
// deleted, no host creates from it.
func testTemplatesTravel(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("tt-%d", time.Now().UnixNano()%1_000_000)
	r := do(t, "eu", "POST", "/v3/templates", map[string]any{"name": name, "cpuCount": 1, "memoryMB": 512}, nil)
	if r.status != 202 {
		t.Fatalf("create template: %d %s", r.status, r.body)
	}
	var tpl struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	r.json(t, &tpl)
	t.Cleanup(func() { do(t, "eu", "DELETE", "/templates/"+name, nil, nil) })
	r = do(t, "eu", "POST", "/v2/templates/"+tpl.TemplateID+"/builds/"+tpl.BuildID, map[string]any{
		"fromTemplate": "base",
		"steps":        []map[string]any{{"type": "RUN", "args": []string{"mkdir -p /srv/www && echo travelled > /srv/www/index.html && echo step > /srv/step.txt", "root"}}},
		"startCmd":     "python3 -m http.server 8000 --directory /srv/www",
		"readyCmd":     "curl -sf http://127.0.0.1:8000/ >/dev/null",
	}, nil)
	if r.status != 202 {
		t.Fatalf("start build: %d %s", r.status, r.body)
	}
	var status struct {
		Status string `json:"status"`
		Logs   []struct {
			Message string `json:"message"`
		} `json:"logEntries"`
	}
	eventually(t, 3*time.Minute, "the build is ready", func() bool {
		r := do(t, "eu", "GET", "/templates/"+tpl.TemplateID+"/builds/"+tpl.BuildID+"/status", nil, nil)
		r.json(t, &status)
		if status.Status == "error" {
			t.Fatalf("build failed: %s", r.body)
		}
		return status.Status == "ready"
	})
	published := false
	for _, l := range status.Logs {
		published = published || strings.Contains(l.Message, "published to the cluster's chunk store")
	}
	if !published {
		t.Errorf("the build log does not say it was published: %+v", status.Logs)
	}

	// The template host (slot 1) takes no creates: another host pulls.
	if err := c.Admin(ctx, "cordon", "1"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Admin(ctx, "activate", "1"); err != nil {
			t.Errorf("activating host 1 again: %v", err)
		}
	}()
	time.Sleep(2 * time.Second) // the gateways hear of it (NOTIFY)
	t0 := time.Now()
	sb := create(t, "eu", map[string]any{"templateID": name + ":default"})
	took := time.Since(t0)
	if h := hostOf(t, sb); h.N == 1 {
		t.Fatalf("created on the cordoned template host")
	}
	check := `
import urllib.request
print(open("/srv/step.txt").read().strip(), urllib.request.urlopen("http://127.0.0.1:8000/", timeout=5).read().decode().strip())`
	if out, status := runCode(t, "eu", sb, check); out != "step travelled\n" {
		t.Fatalf("the pulled template on another host: %d %q", status, out)
	}
	t.Logf("first create from the template on another host (pull included): %s", took.Round(time.Millisecond))
	// That host pulled it (its layers and warm image, into its own data
	// directory); the template host did not.
	b := hostOf(t, sb)
	pulled := fmt.Sprintf(`msg="template pulled from the cluster" template.id=%s build.id=%s `, tpl.TemplateID, tpl.BuildID)
	if !strings.Contains(b.Logs(), pulled) {
		t.Errorf("host %d did not log the pull of build %s", b.N, tpl.BuildID)
	}
	for _, f := range []string{"artifact.json", "rootfs/srv/step.txt", "image/checkpoint.img"} {
		if _, err := os.Stat(filepath.Join(b.DataDir, "custom-templates", "pulled", tpl.BuildID, f)); err != nil {
			t.Errorf("host %d's pull of the template: %v", b.N, err)
		}
	}
	if strings.Contains(c.Hosts[0].Logs(), pulled) {
		t.Errorf("the template host pulled its own template")
	}
	second := create(t, "eu", map[string]any{"templateID": tpl.TemplateID})
	if out, _ := runCode(t, "eu", second, check); out != "step travelled\n" {
		t.Fatalf("a second sandbox from the pulled template: %q", out)
	}

	// A snapshot of a sandbox of the template, taken on the host that
	// pulled it, starts a sandbox on the template host (the other one
	// cordoned), from that host's own copy of the template's root.
	if out, _ := runCode(t, "eu", sb, `q = 5; open("/tmp/snap.txt", "w").write("on B"); print(q)`); out != "5\n" {
		t.Fatalf("setting state up: %q", out)
	}
	r = do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/snapshots", map[string]any{"name": name + "-snap"}, nil)
	if r.status != 201 {
		t.Fatalf("snapshot: %d %s", r.status, r.body)
	}
	var sn struct {
		ID string `json:"snapshotID"`
	}
	r.json(t, &sn)
	t.Cleanup(func() { do(t, "eu", "DELETE", "/snapshots/"+sn.ID, nil, nil) })
	waitUploaded(t, sn.ID)
	if err := c.Admin(ctx, "activate", "1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Admin(ctx, "cordon", fmt.Sprint(b.N)); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Admin(ctx, "activate", fmt.Sprint(b.N)); err != nil {
			t.Errorf("activating host %d again: %v", b.N, err)
		}
	}()
	time.Sleep(2 * time.Second) // the gateways hear of it (NOTIFY)
	r = do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": sn.ID, "timeout": 120}, nil)
	if r.status != 201 {
		t.Fatalf("create from the snapshot on another host: %d %s", r.status, r.body)
	}
	var restored sandbox
	r.json(t, &restored)
	t.Cleanup(func() { do(t, "eu", "DELETE", "/sandboxes/"+restored.ID, nil, nil) })
	rh := hostOf(t, restored)
	if rh.N == b.N {
		t.Fatalf("restored on the cordoned host %d", b.N)
	}
	if out, status := runCode(t, "eu", restored, `print(q, open("/tmp/snap.txt").read())`+"\n"+check); out != "5 on B\nstep travelled\n" {
		t.Fatalf("the snapshot restored on host %d: %d %q", rh.N, status, out)
	}
	db := openDB(t)
	defer db.Close()
	row, err := db.GetRecord(ctx, restored.ID)
	var rec struct{ Rootfs string }
	if err != nil || json.Unmarshal(row.Record, &rec) != nil || !strings.HasPrefix(rec.Rootfs, rh.DataDir+"/") {
		t.Errorf("the sandbox restored on host %d runs on root %q, not its host's copy of the template (%v)", rh.N, rec.Rootfs, err)
	}

	// Another team sees nothing of it.
	if err := c.Admin(ctx, "team", "add", "stranger"); err != nil && !strings.Contains(err.Error(), "exists") {
		t.Fatal(err)
	}
	key, err := c.AdminOut(ctx, "key", "create", "stranger", "k")
	if err != nil {
		t.Fatal(err)
	}
	other := map[string]string{"X-API-KEY": strings.TrimSpace(key)}
	if r := do(t, "eu", "GET", "/templates/"+tpl.TemplateID, nil, other); r.status != 404 {
		t.Errorf("another team got the template: %d %s", r.status, r.body)
	}
	if r := do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": name}, other); r.status != 404 {
		t.Errorf("another team created from the template: %d %s", r.status, r.body)
	}

	// Deleted: no host creates from it.
	if r := do(t, "eu", "DELETE", "/templates/"+name, nil, nil); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": name}, nil); r.status != 404 {
		t.Errorf("create from a deleted template: %d %s", r.status, r.body)
	}
	rowsIntact(t)
}
