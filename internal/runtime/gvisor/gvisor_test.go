package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellfork/cellfork/internal/netns"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

const testRunsc = "/usr/local/lib/cellfork/runsc"

func newTestRuntime(t *testing.T) *Runtime {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("gVisor tests need root")
	}
	root := t.TempDir()
	// runsc bind-mounts a shared "null" network namespace into its root.
	t.Cleanup(func() {
		for unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH) == nil {
		}
	})
	r, err := New(Config{Runsc: testRunsc, Root: root, CgroupParent: "/cellfork-test"})
	if err != nil {
		t.Fatalf("%v (make setup installs runsc)", err)
	}
	return r
}

func randomID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestStartStatsDestroy boots a real gVisor sandbox on the host's root
// filesystem (read-only lower layer: writes stay in sandbox memory).
func TestStartStatsDestroy(t *testing.T) {
	r := newTestRuntime(t)
	ctx, rec := timing.With(context.Background())
	id := randomID()
	n, err := netns.Create("cft" + id[:8])
	if err != nil {
		t.Fatal(err)
	}
	defer n.Destroy()
	start := time.Now()
	err = r.Start(ctx, sandbox.Spec{
		RuntimeID: id,
		BundleDir: filepath.Join(t.TempDir(), "bundle"),
		Rootfs:    "/",
		Args:      []string{"/bin/sh", "-c", "echo hi > /written-inside; exec sleep 1000"},
		Env:       []string{"PATH=/usr/bin:/bin"},
		NetnsPath: n.SandboxPath(),
		Limits:    sandbox.Limits{CPUCount: 1, MemoryMB: 256, PidsMax: 100},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("start took %v: %s", time.Since(start), rec.Header(time.Since(start)))
	defer r.Destroy(context.Background(), id)
	running, err := r.Running(ctx, id)
	if err != nil || !running {
		t.Fatalf("Running = %v, %v", running, err)
	}
	ids, err := r.List(ctx)
	if err != nil || len(ids) != 1 || ids[0] != id {
		t.Fatalf("List = %v, %v", ids, err)
	}
	st, err := r.Stats(ctx, id)
	if err != nil || st.MemoryBytes == 0 {
		t.Fatalf("Stats = %+v, %v", st, err)
	}
	if _, err := os.Stat("/written-inside"); err == nil {
		t.Fatal("a write inside the sandbox reached the host rootfs")
	}
	if err := r.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if running, _ := r.Running(ctx, id); running {
		t.Fatal("still running after Destroy")
	}
	if err := r.Destroy(ctx, id); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/cellfork-test/" + id); err == nil {
		t.Fatal("cgroup left behind")
	}
}
