package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// withDaemon runs f against a second daemon with extra flags, on its own
// data directory, and checks it leaves nothing behind once its sandboxes
// are killed.
func withDaemon(t *testing.T, flags []string, f func()) {
	t.Helper()
	withDaemonEnv(t, nil, flags, f)
}

// withDaemonEnv is withDaemon with env added to the daemon's environment.
func withDaemonEnv(t *testing.T, env, flags []string, f func()) {
	t.Helper()
	dataDir := t.TempDir()
	saved := d
	nd, err := startDaemonEnv(filepath.Join(repoRoot, "bin", "cellfork"), dataDir, freeAddr(), env, flags...)
	if err != nil {
		t.Fatal(err)
	}
	d = nd
	defer func() {
		d.stop()
		for unix.Unmount(filepath.Join(dataDir, "runsc", "null-netns"), unix.MNT_DETACH) == nil {
		}
		d = saved
	}()
	f()
}

// TestBurstQueuesThenRefuses: more concurrent creates than the daemon may
// start at once wait in line; past the line's bound they get 503 with
// Retry-After. Nothing crashes and nothing leaks.
func TestBurstQueuesThenRefuses(t *testing.T) {
	withDaemon(t, []string{"--pool-ready", "0", "--pool-shells", "0", "--start-concurrency", "1", "--start-queue", "2"}, func() {
		const n = 8
		var wg sync.WaitGroup
		statuses := make([]int, n)
		retry := make([]string, n)
		ids := make([]string, n)
		for i := range n {
			wg.Go(func() {
				r := call(t, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 60})
				statuses[i], retry[i] = r.status, r.header.Get("Retry-After")
				if r.status == http.StatusCreated {
					var sb sandboxInfo
					r.json(t, &sb)
					ids[i] = sb.SandboxID
				}
			})
		}
		wg.Wait()
		created, refused := 0, 0
		for i, st := range statuses {
			switch st {
			case http.StatusCreated:
				created++
			case http.StatusServiceUnavailable:
				refused++
				if retry[i] == "" {
					t.Errorf("503 without Retry-After")
				}
			default:
				t.Errorf("create %d: unexpected status %d", i, st)
			}
		}
		// One runs, two wait: at least three are served, the rest refused.
		if created < 3 || refused == 0 || created+refused != n {
			t.Errorf("created %d, refused %d of %d", created, refused, n)
		}
		for _, id := range ids {
			if id != "" {
				if r := call(t, "DELETE", "/sandboxes/"+id, nil); r.status != http.StatusNoContent {
					t.Errorf("kill %s: %d", id, r.status)
				}
			}
		}
		eventually(t, 10*time.Second, "no runtime left", func() bool {
			m, _ := filepath.Glob(filepath.Join(d.dataDir, "runtimes", "*"))
			return len(m) == 0
		})
	})
}

// TestSnapshotCap: past --snapshot-cap-mb, snapshots are refused with 507
// and a message, and deleting one makes room again.
func TestSnapshotCap(t *testing.T) {
	withDaemon(t, []string{"--pool-ready", "0", "--snapshot-cap-mb", "1"}, func() {
		sb := create(t, nil)
		first := snapshotOf(t, sb.SandboxID, "")
		r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", map[string]any{})
		if r.status != http.StatusInsufficientStorage || r.errMessage() == "" {
			t.Fatalf("snapshot past the cap: %d %s", r.status, r.body)
		}
		var usage struct {
			TotalBytes int64 `json:"totalBytes"`
			CapBytes   int64 `json:"capBytes"`
			Count      int64 `json:"count"`
		}
		call(t, "GET", "/snapshots/usage", nil).json(t, &usage)
		if usage.Count != 1 || usage.TotalBytes < 1<<20 || usage.CapBytes != 1<<20 {
			t.Errorf("usage %+v", usage)
		}
		if r := call(t, "DELETE", "/snapshots/"+first, nil); r.status != http.StatusNoContent {
			t.Fatalf("delete: %d", r.status)
		}
		if _, err := os.Stat(filepath.Join(d.dataDir, "snapshots", first)); err == nil {
			t.Error("the deleted snapshot's image is still on disk")
		}
		snapshotOf(t, sb.SandboxID, "")
		killQuietly(sb.SandboxID)
	})
}

// TestAutoPauseAndRestart: a sandbox created with autoPause pauses at its
// timeout instead of dying; paused sandboxes (in memory and on disk)
// survive a daemon restart, and connect brings their state back.
func TestAutoPauseAndRestart(t *testing.T) {
	auto := create(t, map[string]any{"timeout": 120, "autoPause": true})
	st := seed(t, auto, "auto")
	if r := call(t, "POST", "/sandboxes/"+auto.SandboxID+"/timeout", map[string]int{"timeout": 1}); r.status != http.StatusNoContent {
		t.Fatalf("set timeout: %d", r.status)
	}
	eventually(t, 15*time.Second, "the timeout to pause it", func() bool {
		return info(t, auto.SandboxID)["state"] == "paused"
	})
	onDisk := create(t, nil)
	stDisk := seed(t, onDisk, "disk")
	if r := call(t, "POST", "/sandboxes/"+onDisk.SandboxID+"/pause", map[string]any{"spill": true}); r.status != http.StatusNoContent {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	crashDaemon(t, 0)
	for _, c := range []struct {
		sb sandboxInfo
		st state
	}{{auto, st}, {onDisk, stDisk}} {
		if s := info(t, c.sb.SandboxID)["state"]; s != "paused" {
			t.Errorf("%s: state %v after restart", c.sb.SandboxID, s)
		}
		if r := call(t, "POST", "/v2/sandboxes/"+c.sb.SandboxID+"/connect", map[string]any{"timeout": 120}); r.status != http.StatusCreated {
			t.Fatalf("resume after restart: %d %s", r.status, r.body)
		}
		check(t, c.sb, c.st)
	}
}
