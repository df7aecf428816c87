package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// killWhenSeen SIGKILLs the first process whose command line matches
// pattern (pgrep -f) within d, and reports whether it did.
func killWhenSeen(pattern string, d time.Duration) <-chan bool {
	done := make(chan bool, 1)
	go func() {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			out, _ := exec.Command("pgrep", "-f", pattern).Output()
			if pids := strings.Fields(string(out)); len(pids) > 0 {
				for _, p := range pids {
					_ = exec.Command("kill", "-9", p).Run()
				}
				done <- true
				return
			}
			time.Sleep(time.Millisecond)
		}
		done <- false
	}()
	return done
}

// fire sends a control-plane request and ignores the outcome: the daemon
// is about to be killed under it.
func fire(method, path string, body any) {
	raw, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, d.url+path, bytes.NewReader(raw))
	req.Header.Set("X-API-KEY", apiKey)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
}

// crashDaemon SIGKILLs the daemon after delay and starts a new one on the
// same data directory and address.
func crashDaemon(t *testing.T, delay time.Duration) {
	t.Helper()
	time.Sleep(delay)
	addr := strings.TrimPrefix(d.url, "http://")
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	nd, err := startDaemon(d.dataDir, addr)
	if err != nil {
		t.Fatal(err)
	}
	d = nd
}

// allSound checks that every sandbox the daemon lists works, and that no
// half-written image or fork image is left.
func allSound(t *testing.T) {
	t.Helper()
	r := call(t, "GET", "/v2/sandboxes?limit=1000", nil)
	var list []struct {
		SandboxID string `json:"sandboxID"`
		State     string `json:"state"`
	}
	r.json(t, &list)
	for _, s := range list {
		if s.State != "running" {
			continue
		}
		sb := sandboxInfo{SandboxID: s.SandboxID}
		var c struct {
			EnvdAccessToken string `json:"envdAccessToken"`
		}
		call(t, "POST", "/v2/sandboxes/"+s.SandboxID+"/connect", map[string]any{}).json(t, &c)
		sb.EnvdAccessToken = c.EnvdAccessToken
		if out := stdoutOf(runCode(t, sb, "print('alive')")); out != "alive\n" {
			t.Errorf("listed sandbox %s is half-made: %q", s.SandboxID, out)
		}
	}
	for _, dir := range []string{"snapshots", "paused", "forks"} {
		m, _ := filepath.Glob(filepath.Join(d.dataDir, dir, "*.tmp-*"))
		if len(m) > 0 {
			t.Errorf("half-written images left: %v", m)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(d.dataDir, "forks", "*")); len(m) > 0 {
		t.Errorf("fork images left: %v", m)
	}
	// Every snapshot listed can still be restored.
	var snaps []struct {
		SnapshotID string `json:"snapshotID"`
	}
	call(t, "GET", "/snapshots", nil).json(t, &snaps)
	for _, sn := range snaps {
		if _, err := os.Stat(filepath.Join(d.dataDir, "snapshots", sn.SnapshotID, "checkpoint.img")); err != nil {
			t.Errorf("snapshot %s is listed but its image is incomplete", sn.SnapshotID)
		}
	}
}

func TestCrashDuringFork(t *testing.T) {
	parent := create(t, map[string]any{"timeout": 300})
	st := seed(t, parent, "fork-crash")
	go fire("POST", "/sandboxes/"+parent.SandboxID+"/fork", map[string]any{"count": 4})
	crashDaemon(t, 150*time.Millisecond)
	check(t, parent, st)
	allSound(t)
	record("crashes", "daemon SIGKILLed mid fork(4)", "parent intact, no half-made child", "checked", !t.Failed())
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	call(t, "GET", "/v2/sandboxes?limit=1000", nil).json(t, &list)
	for _, s := range list {
		if s.SandboxID != parent.SandboxID && info(t, s.SandboxID)["parentSandboxID"] == parent.SandboxID {
			kid := s.SandboxID
			t.Cleanup(func() { killQuietly(kid) })
		}
	}
}

func TestCrashDuringSnapshotAndRollback(t *testing.T) {
	sb := create(t, map[string]any{"timeout": 300})
	st := seed(t, sb, "snap-crash")
	go fire("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", map[string]any{})
	crashDaemon(t, 20*time.Millisecond)
	check(t, sb, st)
	allSound(t)
	record("crashes", "daemon SIGKILLed mid snapshot", "sandbox intact, no corrupt snapshot", "checked", !t.Failed())

	sid := snapshotOf(t, sb.SandboxID, "")
	mutate(t, sb, "after")
	go fire("POST", "/sandboxes/"+sb.SandboxID+"/rollback", map[string]string{"snapshotID": sid})
	crashDaemon(t, 60*time.Millisecond)
	// Either the rollback happened or it did not: never half.
	got := stdoutOf(runCode(t, sb, "print(marker)"))
	switch got {
	case "snap-crash\n":
		check(t, sb, st)
	case "after\n":
	default:
		t.Errorf("after a crash mid-rollback the REPL holds %q", got)
	}
	allSound(t)
	record("crashes", "daemon SIGKILLed mid rollback", "old or new state, never half", "REPL holds "+got, !t.Failed())
}

// TestKillRunscDuringSnapshot kills the runsc process that does a
// snapshot's work: the sandbox's own (the daemon asks it over its control
// socket). The snapshot fails cleanly, the sandbox is reported dead with
// its reason, and nothing half-written or recorded is left.
func TestKillRunscDuringSnapshot(t *testing.T) {
	sb := create(t, map[string]any{"timeout": 300, "memoryMB": 1024})
	runCode(t, sb, "ballast = bytearray(b'x') * (300 << 20)") // make the checkpoint take a while
	rid := runtimeID(t, sb.SandboxID)
	killed := make(chan bool, 1)
	go func() {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if m, _ := filepath.Glob(filepath.Join(d.dataDir, "snapshots", "*.tmp-*", "pages.img")); len(m) > 0 {
				killed <- exec.Command("pkill", "-9", "-f", "runsc-sandbox.*"+rid).Run() == nil
				return
			}
		}
		killed <- false
	}()
	r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", map[string]any{})
	if !<-killed {
		t.Fatal("never saw the checkpoint being written")
	}
	if r.status == 201 {
		t.Logf("the checkpoint finished before the kill landed: %s", r.body)
	} else if r.status < 500 {
		t.Errorf("a failed snapshot should be a 5xx, got %d %s", r.status, r.body)
	}
	eventually(t, 10*time.Second, "the dead sandbox to be reported", func() bool {
		return call(t, "GET", "/sandboxes/"+sb.SandboxID, nil).status == http.StatusNotFound
	})
	var snaps []struct {
		SandboxID string `json:"sandboxID"`
	}
	call(t, "GET", "/snapshots?limit=1000", nil).json(t, &snaps)
	for _, s := range snaps {
		if s.SandboxID == sb.SandboxID && r.status != 201 {
			t.Errorf("a failed snapshot was recorded: %+v", s)
		}
	}
	allSound(t)
	record("crashes", "runsc SIGKILLed mid checkpoint", "snapshot fails cleanly, sandbox reported dead, nothing half-written", fmt.Sprint(r.status), !t.Failed())
}

func TestCrashDuringPause(t *testing.T) {
	sb := create(t, map[string]any{"timeout": 300})
	st := seed(t, sb, "pause-crash")
	go fire("POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{"spill": true})
	crashDaemon(t, 30*time.Millisecond)
	// Whatever the crash interrupted, connect brings the same state back.
	if r := call(t, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 120}); r.status != 200 && r.status != 201 {
		t.Fatalf("connect after a crash mid-pause: %d %s", r.status, r.body)
	}
	check(t, sb, st)
	allSound(t)
	record("crashes", "daemon SIGKILLed mid pause-to-disk", "connect brings the same state back", "checked", !t.Failed())
}
