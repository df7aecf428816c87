package integration

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/store"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// runtimeID reads a sandbox's current runtime id from the daemon's store.
func runtimeID(t *testing.T, sandboxID string) string {
	t.Helper()
	st, err := store.Open(filepath.Join(d.dataDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := st.Get(context.Background(), sandboxID)
	if err != nil {
		t.Fatal(err)
	}
	return rec.RuntimeID
}

// leftovers lists what of a runtime instance still exists on the host.
func leftovers(t *testing.T, rid string) []string {
	t.Helper()
	var left []string
	if m, _ := filepath.Glob("/run/netns/cf*-" + rid + "-*"); len(m) > 0 {
		left = append(left, fmt.Sprint("netns ", m))
	}
	if _, err := os.Stat(filepath.Join(d.dataDir, "runtimes", rid)); err == nil {
		left = append(left, "bundle dir")
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/cellfork/" + rid); len(m) > 0 {
		left = append(left, fmt.Sprint("cgroups ", m))
	}
	if ps, _ := exec.Command("pgrep", "-f", "runtimes/"+rid+"/").Output(); len(strings.TrimSpace(string(ps))) > 0 {
		left = append(left, "processes "+strings.TrimSpace(string(ps)))
	}
	return left
}

func TestLifecycle(t *testing.T) {
	sb := create(t, map[string]any{"timeout": 120, "metadata": map[string]string{"owner": "itest"},
		"envVars": map[string]string{"GREETING": "hello"}})
	r := call(t, "GET", "/sandboxes/"+sb.SandboxID, nil)
	var info struct {
		State    string            `json:"state"`
		Metadata map[string]string `json:"metadata"`
		CPUCount int               `json:"cpuCount"`
		MemoryMB int               `json:"memoryMB"`
		EndAt    time.Time         `json:"endAt"`
	}
	r.json(t, &info)
	if r.status != 200 || info.State != "running" || info.Metadata["owner"] != "itest" || info.CPUCount < 1 || info.MemoryMB < 128 {
		t.Fatalf("get: %d %s", r.status, r.body)
	}
	if left := time.Until(info.EndAt); left < 100*time.Second || left > 121*time.Second {
		t.Errorf("endAt %v is not ~120s away", info.EndAt)
	}

	out, _, code := run(t, sb, "", "echo $GREETING; whoami; pwd")
	if out != "hello\nuser\n/home/user\n" || code != 0 {
		t.Errorf("exec as default user: %q, %d", out, code)
	}
	out, _, _ = run(t, sb, "root", "whoami")
	if out != "root\n" {
		t.Errorf("exec as root: %q", out)
	}
	if _, _, code := run(t, sb, "", "exit 3"); code != 3 {
		t.Errorf("exit code %d, want 3", code)
	}
	if ev := runCode(t, sb, "x = 41\nprint(x + 1)"); stdoutOf(ev) != "42\n" {
		t.Errorf("run_code: %v", ev)
	}

	r = call(t, "POST", "/sandboxes/"+sb.SandboxID+"/timeout", map[string]int{"timeout": 600})
	if r.status != http.StatusNoContent {
		t.Errorf("set timeout: %d %s", r.status, r.body)
	}
	r = call(t, "GET", "/sandboxes/"+sb.SandboxID+"/metrics", nil)
	if r.status != 200 || !strings.Contains(string(r.body), "memUsed") {
		t.Errorf("metrics: %d %s", r.status, r.body)
	}
	r = call(t, "GET", "/v2/sandboxes?metadata=owner%3Ditest", nil)
	if r.status != 200 || !strings.Contains(string(r.body), sb.SandboxID) {
		t.Errorf("list by metadata: %d %s", r.status, r.body)
	}
	r = call(t, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{})
	if r.status != 200 || !strings.Contains(string(r.body), sb.EnvdAccessToken) {
		t.Errorf("connect: %d %s", r.status, r.body)
	}

	rid := runtimeID(t, sb.SandboxID)
	if r = call(t, "DELETE", "/sandboxes/"+sb.SandboxID, nil); r.status != http.StatusNoContent {
		t.Fatalf("kill: %d %s", r.status, r.body)
	}
	if r = call(t, "GET", "/sandboxes/"+sb.SandboxID, nil); r.status != 404 {
		t.Errorf("get after kill: %d", r.status)
	}
	if r = call(t, "DELETE", "/sandboxes/"+sb.SandboxID, nil); r.status != 404 {
		t.Errorf("second kill: %d", r.status)
	}
	if left := leftovers(t, rid); len(left) > 0 {
		t.Errorf("after kill these remain: %v", left)
	}
}

func TestListPaging(t *testing.T) {
	tag := map[string]string{"paging": time.Now().Format("150405.000")}
	var ids []string
	for range 3 {
		ids = append(ids, create(t, map[string]any{"metadata": tag}).SandboxID)
	}
	seen := map[string]bool{}
	path := "/v2/sandboxes?limit=2&metadata=paging%3D" + tag["paging"]
	for pages := 0; path != ""; pages++ {
		if pages > 3 {
			t.Fatal("paging does not end")
		}
		r := call(t, "GET", path, nil)
		var page []struct {
			SandboxID string `json:"sandboxID"`
		}
		r.json(t, &page)
		if len(page) > 2 {
			t.Fatalf("page of %d with limit=2", len(page))
		}
		for _, s := range page {
			seen[s.SandboxID] = true
		}
		path = ""
		if tok := r.header.Get("X-Next-Token"); tok != "" {
			path = "/v2/sandboxes?limit=2&metadata=paging%3D" + tag["paging"] + "&nextToken=" + tok
		}
	}
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("sandbox %s missing from the pages", id)
		}
	}
}

func TestTimeoutKills(t *testing.T) {
	sb := create(t, map[string]any{"timeout": 2})
	rid := runtimeID(t, sb.SandboxID)
	eventually(t, 15*time.Second, "the sandbox to expire", func() bool {
		return call(t, "GET", "/sandboxes/"+sb.SandboxID, nil).status == 404
	})
	eventually(t, 5*time.Second, "its resources to be freed", func() bool {
		return len(leftovers(t, rid)) == 0
	})
}
