package cluster

import (
	"context"
	"fmt"
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
	second := create(t, "eu", map[string]any{"templateID": tpl.TemplateID})
	if out, _ := runCode(t, "eu", second, check); out != "step travelled\n" {
		t.Fatalf("a second sandbox from the pulled template: %q", out)
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
