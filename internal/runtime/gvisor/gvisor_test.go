package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellfork/cellfork/internal/netns"
	"github.com/cellfork/cellfork/internal/runtime/runtimetest"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// testRunsc is the runsc the tests drive: make setup's, or CELLFORK_RUNSC.
var testRunsc = func() string {
	if p := os.Getenv("CELLFORK_RUNSC"); p != "" {
		return p
	}
	return "/usr/local/lib/cellfork/runsc"
}()

func newTestRuntime(t *testing.T) *Runtime {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("gVisor tests need root")
	}
	root := filepath.Join(t.TempDir(), "runsc") // its pause marks go beside it
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
	n, err := netns.Create("cft"+id[:8], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Destroy()
	start := time.Now()
	err = r.Start(ctx, sandbox.Spec{
		RuntimeID: id,
		BundleDir: filepath.Join(t.TempDir(), id),
		Rootfs:    "/",
		Args:      []string{"/bin/sh", "-c", "echo hi > /written-inside; exec sleep 1000"},
		Env:       []string{"PATH=/usr/bin:/bin"},
		NetnsPath: n.SandboxPath(),
		Limits:    sandbox.Limits{CPUCount: 1, MemoryMB: 256, PidsMax: 100, OpenFiles: 1024},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("start took %v: %s", time.Since(start), rec.Header(time.Since(start)))
	defer r.Destroy(context.Background(), id)
	if st, err := r.State(ctx, id); err != nil || st != "running" {
		t.Fatalf("State = %q, %v", st, err)
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
	if st, _ := r.State(ctx, id); st != "" {
		t.Fatalf("state %q after Destroy", st)
	}
	if err := r.Destroy(ctx, id); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/cellfork-test/" + id); err == nil {
		t.Fatal("cgroup left behind")
	}
}

func spec(t *testing.T, id string, n *netns.Network, args ...string) sandbox.Spec {
	return sandbox.Spec{
		RuntimeID: id, BundleDir: filepath.Join(t.TempDir(), id), Rootfs: "/",
		Args: args, Env: []string{"PATH=/usr/bin:/bin"}, NetnsPath: n.SandboxPath(),
		Limits: sandbox.Limits{CPUCount: 1, MemoryMB: 256, PidsMax: 100, OpenFiles: 1024},
	}
}

func newNet(t *testing.T) *netns.Network {
	t.Helper()
	n, err := netns.Create("cft"+randomID()[:8], nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Destroy() })
	return n
}

func (r *Runtime) execOut(t *testing.T, id string, args ...string) string {
	t.Helper()
	out, err := r.runsc(context.Background(), 30*time.Second, append([]string{"exec", id}, args...)...)
	if err != nil {
		t.Fatalf("exec %v: %v", args, err)
	}
	return string(out)
}

// TestCheckpointRestorePause: a checkpoint restored into a Prepared sandbox
// in another network namespace keeps files written to the overlay and
// running processes with their pids; pause and resume change the state.
func TestCheckpointRestorePause(t *testing.T) {
	r := newTestRuntime(t)
	ctx := context.Background()
	parent := randomID()
	ps := spec(t, parent, newNet(t), "/bin/sh", "-c", "echo $$ > /tmp/pid; echo state > /tmp/file; exec sleep 1000")
	if err := r.Start(ctx, ps); err != nil {
		t.Fatal(err)
	}
	defer r.Destroy(ctx, parent)
	time.Sleep(200 * time.Millisecond) // let the shell write its files
	pid := r.execOut(t, parent, "cat", "/tmp/pid")

	img := t.TempDir()
	if err := r.Checkpoint(ctx, parent, img, true); err != nil {
		t.Fatal(err)
	}
	if st, _ := r.State(ctx, parent); st != "running" {
		t.Fatalf("parent state %q after a leave-running checkpoint", st)
	}
	child := randomID()
	cs := spec(t, child, newNet(t), "/bin/sh", "-c", "exec sleep 1000")
	if err := r.Prepare(ctx, cs); err != nil {
		t.Fatal(err)
	}
	defer r.Destroy(ctx, child)
	if st, _ := r.State(ctx, child); st != "created" {
		t.Fatalf("prepared state %q", st)
	}
	if err := r.Restore(ctx, cs, img, true); err != nil {
		t.Fatal(err)
	}
	// A Background restore with no prepared sandbox: idle once made.
	bg := spec(t, randomID(), newNet(t), "/bin/sh", "-c", "exec sleep 1000")
	bg.Background = true
	if err := r.Restore(ctx, bg, img, false); err != nil {
		t.Fatal(err)
	}
	defer r.Destroy(ctx, bg.RuntimeID)
	// Each way runsc makes a cgroup (run, create, restore) leaves it a
	// burst of a period's quota.
	for _, s := range []sandbox.Spec{ps, cs, bg} {
		checkBurst(t, r, s)
	}
	if b, err := os.ReadFile(filepath.Join(cpuDir(filepath.Join(r.cfg.CgroupParent, bg.RuntimeID)), "cpu.idle")); err == nil && strings.TrimSpace(string(b)) != "1" {
		t.Errorf("cpu.idle of a Background restore %q, want 1", strings.TrimSpace(string(b)))
	} else if err != nil && !os.IsNotExist(err) {
		t.Error(err)
	}
	if got := r.execOut(t, child, "cat", "/tmp/file"); got != "state\n" {
		t.Errorf("restored file = %q", got)
	}
	if got := r.execOut(t, child, "cat", "/proc/"+strings.TrimSpace(pid)+"/cmdline"); !strings.Contains(got, "sleep") {
		t.Errorf("process %s not restored: %q", pid, got)
	}
	// The child diverges from the parent.
	r.execOut(t, child, "sh", "-c", "echo child > /tmp/file")
	if got := r.execOut(t, parent, "cat", "/tmp/file"); got != "state\n" {
		t.Errorf("parent saw the child's write: %q", got)
	}

	if err := r.Pause(ctx, child); err != nil {
		t.Fatal(err)
	}
	if st, _ := r.State(ctx, child); st != "paused" {
		t.Fatalf("state %q after Pause", st)
	}
	if err := r.Resume(ctx, child); err != nil {
		t.Fatal(err)
	}
	if st, _ := r.State(ctx, child); st != "running" {
		t.Fatalf("state %q after Resume", st)
	}

	// A pause that a crash cut short: frozen, with an unknown count.
	if err := r.Pause(ctx, child); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(r.mark(child, markPaused), r.mark(child, markPausing)); err != nil {
		t.Fatal(err)
	}
	if st, _ := r.State(ctx, child); st != sandbox.RuntimeUnsure {
		t.Fatalf("state %q after a cut-short pause", st)
	}
	if err := r.Resume(ctx, child); err == nil {
		t.Fatal("resumed a sandbox whose pause count is unknown")
	}
	// It can still be saved, exactly: the way out for the daemon.
	img2 := t.TempDir()
	if err := r.Checkpoint(ctx, child, img2, true); err != nil {
		t.Fatalf("checkpoint of a frozen sandbox: %v", err)
	}
	if err := r.Destroy(ctx, child); err != nil {
		t.Fatal(err)
	}
	if r.hasMark(child, markPausing) || r.hasMark(child, markPaused) {
		t.Error("Destroy left a pause mark behind")
	}
}

// TestRestoreAhead: a prepared sandbox has a `runsc restore --image-path=-`
// waiting beside it (gVisor patch 0023), which restores the image it is
// given; one that ended without a path (end of input) changed nothing, and
// the restore runs a command of its own; Destroy ends a waiting one.
func TestRestoreAhead(t *testing.T) {
	r := newTestRuntime(t)
	if !r.ahead.supported {
		t.Fatalf("%s does not take --image-path=- (patch 0023)", testRunsc)
	}
	ctx := context.Background()
	parent := randomID()
	if err := r.Start(ctx, spec(t, parent, newNet(t), "/bin/sh", "-c", "echo state > /tmp/file; exec sleep 1000")); err != nil {
		t.Fatal(err)
	}
	defer r.Destroy(ctx, parent)
	time.Sleep(200 * time.Millisecond) // let the shell write its file
	img := t.TempDir()
	if err := r.Checkpoint(ctx, parent, img, true); err != nil {
		t.Fatal(err)
	}
	waiting := func(id string) *aheadRestore {
		r.ahead.mu.Lock()
		defer r.ahead.mu.Unlock()
		return r.ahead.m[id]
	}
	prepare := func() sandbox.Spec {
		t.Helper()
		s := spec(t, randomID(), newNet(t), "/bin/sh", "-c", "exec sleep 1000")
		if err := r.Prepare(ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Destroy(ctx, s.RuntimeID) })
		if waiting(s.RuntimeID) == nil {
			t.Fatal("no restore waiting beside a prepared sandbox")
		}
		return s
	}
	restored := func(s sandbox.Spec) {
		t.Helper()
		if got := r.execOut(t, s.RuntimeID, "cat", "/tmp/file"); got != "state\n" {
			t.Errorf("restored file = %q", got)
		}
		if st, _ := r.State(ctx, s.RuntimeID); st != "running" {
			t.Errorf("state %q after the restore", st)
		}
	}

	// The waiting command restores.
	a := prepare()
	if done, err := r.restoreAhead(ctx, a, img); !done || err != nil {
		t.Fatalf("restoreAhead = %v, %v; want done", done, err)
	}
	restored(a)

	// End of input without a path: the command fails, the sandbox stays
	// created, and Restore runs a command of its own.
	b := prepare()
	w := waiting(b.RuntimeID)
	_ = w.stdin.Close()
	<-w.done
	if w.err == nil {
		t.Error("a restore given no image path succeeded")
	}
	if st, _ := r.State(ctx, b.RuntimeID); st != "created" {
		t.Fatalf("state %q after a waiting restore ended without a path", st)
	}
	if err := r.Restore(ctx, b, img, true); err != nil {
		t.Fatal(err)
	}
	restored(b)

	// Destroy ends a waiting command.
	c := prepare()
	w = waiting(c.RuntimeID)
	if err := r.Destroy(ctx, c.RuntimeID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.done:
	default:
		t.Error("the waiting restore outlived Destroy")
	}
	if waiting(c.RuntimeID) != nil {
		t.Error("Destroy left the waiting restore in the table")
	}
}

// TestDestroyStray: a sandbox whose runsc state is gone (runsc killed, with
// the daemon, before it wrote it) is still listed and destroyed.
func TestDestroyStray(t *testing.T) {
	r := newTestRuntime(t)
	ctx := context.Background()
	id := randomID()
	n := newNet(t)
	if err := r.Start(ctx, spec(t, id, n, "/bin/sh", "-c", "exec sleep 1000")); err != nil {
		t.Fatal(err)
	}
	defer r.Destroy(ctx, id)
	pids := r.processes()[id]
	if len(pids) < 2 {
		t.Fatalf("sandbox and gofer processes of %s: %v", id, pids)
	}
	states, _ := filepath.Glob(filepath.Join(r.cfg.Root, "*"+id+"*.state"))
	for _, f := range states {
		_ = os.Remove(f)
	}
	if len(states) == 0 {
		t.Fatal("no runsc state file to remove")
	}
	if ids, err := r.List(ctx); err != nil || !slices.Contains(ids, id) {
		t.Fatalf("List = %v, %v; want the stray %s", ids, err, id)
	}
	if err := r.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); len(r.processes()[id]) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("processes left after Destroy: %v", r.processes()[id])
		}
	}
}

// TestConformance holds gVisor to the runtime contract the fake keeps too.
func TestConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Env {
		r := newTestRuntime(t)
		return runtimetest.Env{Runtime: r, Spec: func(t *testing.T, rid string) sandbox.Spec {
			return spec(t, rid, newNet(t), "/bin/sh", "-c", "exec sleep 1000")
		}}
	})
}

// TestExportRootfsCarriesFiles: a sandbox booted from another's exported
// root filesystem has its files, new and changed, and not those it deleted
// (the whiteouts travel), but none of its memory: it booted afresh.
func TestExportRootfsCarriesFiles(t *testing.T) {
	r := newTestRuntime(t)
	ctx := context.Background()
	old := randomID()
	err := r.Start(ctx, spec(t, old, newNet(t), "/bin/sh", "-c",
		"mkdir -p /work && echo kept > /work/kept && echo changed > /etc/issue.net && rm /etc/debian_version && (sleep 4242 &) && exec sleep 1000"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Destroy(ctx, old)
	time.Sleep(300 * time.Millisecond)
	tar := filepath.Join(t.TempDir(), "upper.tar")
	if err := r.ExportRootfs(ctx, old, tar); err != nil {
		t.Fatal(err)
	}
	fresh := randomID()
	s := spec(t, fresh, newNet(t), "/bin/sh", "-c", "exec sleep 1000")
	s.RootfsUpper = tar
	if err := r.Start(ctx, s); err != nil {
		t.Fatal(err)
	}
	defer r.Destroy(ctx, fresh)
	got := r.execOut(t, fresh, "sh", "-c", "cat /work/kept /etc/issue.net; test -e /etc/debian_version && echo still-there; ps -eo args= | grep -c '[s]leep 4242'; true")
	if got != "kept\nchanged\n0\n" {
		t.Errorf("booted from the export: %q", got)
	}
}

// TestUnknownContainer: only runsc's own answer for an id it does not know
// reads as "already gone" (State "", Destroy nil). A missing runsc binary
// or another failure, even one that mentions a missing file, is an error.
func TestUnknownContainer(t *testing.T) {
	r := newTestRuntime(t)
	ctx := context.Background()
	if st, err := r.State(ctx, randomID()); err != nil || st != "" {
		t.Errorf("State of an unknown id = %q, %v; want \"\", nil", st, err)
	}
	if err := r.Destroy(ctx, randomID()); err != nil {
		t.Errorf("Destroy of an unknown id = %v; want nil", err)
	}

	dir := t.TempDir()
	fake := filepath.Join(dir, "runsc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'open /x/config.json: no such file or directory' >&2\nexit 128\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"missing runsc": filepath.Join(dir, "gone"), "other failure": fake} {
		broken := &Runtime{cfg: Config{Runsc: path, Root: r.cfg.Root, CgroupParent: r.cfg.CgroupParent}}
		if st, err := broken.State(ctx, randomID()); err == nil {
			t.Errorf("%s: State = %q, nil; want an error", name, st)
		}
		if err := broken.Destroy(ctx, randomID()); err == nil {
			t.Errorf("%s: Destroy = nil; want an error", name)
		}
	}
}

// TestDestroyBundleGone: a sandbox whose bundle directory was removed
// under it is still killed by Destroy, by the real runsc (which needs no
// bundle to delete) and when runsc fails on it (say, about the missing
// bundle): then Destroy kills its processes and reports the failure.
func TestDestroyBundleGone(t *testing.T) {
	r := newTestRuntime(t)
	ctx := context.Background()
	fake := filepath.Join(t.TempDir(), "runsc")
	failing := &Runtime{cfg: Config{Runsc: fake, Root: r.cfg.Root, CgroupParent: r.cfg.CgroupParent}}
	for _, rt := range []*Runtime{r, failing} {
		id := randomID()
		s := spec(t, id, newNet(t), "/bin/sh", "-c", "exec sleep 1000")
		if err := r.Start(ctx, s); err != nil {
			t.Fatal(err)
		}
		defer r.Destroy(ctx, id)
		if pids := r.processes()[id]; len(pids) < 2 {
			t.Fatalf("sandbox and gofer processes of %s: %v", id, pids)
		}
		if err := os.RemoveAll(s.BundleDir); err != nil {
			t.Fatal(err)
		}
		script := fmt.Sprintf("#!/bin/sh\necho 'open %s/config.json: no such file or directory' >&2\nexit 128\n", s.BundleDir)
		if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		err := rt.Destroy(ctx, id)
		if rt == failing && err == nil {
			t.Error("Destroy with runsc failing = nil; want its error")
		}
		if rt == r && err != nil {
			t.Errorf("Destroy with the bundle gone: %v", err)
		}
		for deadline := time.Now().Add(5 * time.Second); len(r.processes()[id]) > 0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("processes left after Destroy (err %v): %v", err, r.processes()[id])
			}
		}
	}
}

// holder is a process that holds 8 MiB of private memory (0xa5) and writes,
// every 50 ms, how much of it still is 0xa5 to /tmp/sum: what a restored
// sandbox's memory holds, seen from outside.
var holder = []string{"/usr/bin/python3", "-c", `
import time
b = bytearray(b'\xa5') * (8 << 20)
while True:
    with open('/tmp/sum.tmp', 'w') as f:
        f.write(str(b.count(0xa5)))
    import os; os.replace('/tmp/sum.tmp', '/tmp/sum')
    time.sleep(0.05)
`}

func readManifest(t *testing.T, dir string) imageManifest {
	t.Helper()
	var m imageManifest
	b, err := os.ReadFile(filepath.Join(dir, "image.json"))
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil {
		t.Fatalf("image.json of %s: %v", dir, err)
	}
	return m
}

// TestImageBases: a checkpoint of a restored sandbox references the image
// it came from (image-cow) and keeps it beside itself (hard link or copy on
// disk; a held descriptor on tmpfs), so it restores after every earlier
// image directory is deleted.
func TestImageBases(t *testing.T) {
	r := newTestRuntime(t)
	ctx := context.Background()
	// sum is what the holder of sandbox id computes now (not what an image
	// froze in /tmp/sum).
	sum := func(id string) string {
		t.Helper()
		r.execOut(t, id, "rm", "-f", "/tmp/sum")
		for range 100 {
			if out, err := r.runsc(ctx, 30*time.Second, "exec", id, "cat", "/tmp/sum"); err == nil && len(out) > 0 {
				return string(out)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s never wrote /tmp/sum", id)
		return ""
	}
	const full = "8388608"
	boot := randomID()
	if err := r.Start(ctx, spec(t, boot, newNet(t), holder...)); err != nil {
		t.Fatal(err)
	}
	defer r.Destroy(ctx, boot)
	if got := sum(boot); got != full {
		t.Fatalf("booted holder: %s", got)
	}
	restore := func(img string) string {
		t.Helper()
		id := randomID()
		if err := r.Restore(ctx, spec(t, id, newNet(t), "/bin/true"), img, false); err != nil {
			t.Fatalf("restoring %s: %v", img, err)
		}
		t.Cleanup(func() { r.Destroy(context.Background(), id) })
		if got := sum(id); got != full {
			t.Errorf("restored from %s: holder reports %s", img, got)
		}
		return id
	}

	// A booted sandbox's image references nothing.
	img1 := filepath.Join(t.TempDir(), "img1")
	checkpointTo(t, r, boot, img1)
	m1 := readManifest(t, img1)
	if len(m1.Bases) != 0 || !validImageID(m1.ID) {
		t.Fatalf("image of a booted sandbox: %+v", m1)
	}
	// A restored one's references the image it came from: on tmpfs as a
	// held descriptor.
	c1 := restore(img1)
	shm, err := os.MkdirTemp("/dev/shm", "cellfork-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(shm)
	img2 := filepath.Join(shm, "img2")
	checkpointTo(t, r, c1, img2)
	if m2 := readManifest(t, img2); len(m2.Bases) != 1 || m2.Bases[0] != m1.ID {
		t.Fatalf("image of a restored sandbox references %v, want [%s]", m2.Bases, m1.ID)
	}
	if fi, err := os.Lstat(filepath.Join(img2, "base-"+m1.ID+".img")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("base on tmpfs is not a held descriptor: %v", err)
	}
	if err := os.RemoveAll(img1); err != nil {
		t.Fatal(err)
	}
	c2 := restore(img2)
	// On disk, with every earlier image gone: copies.
	img3 := filepath.Join(t.TempDir(), "img3")
	checkpointTo(t, r, c2, img3)
	m3 := readManifest(t, img3)
	for _, b := range m3.Bases {
		if fi, err := os.Lstat(filepath.Join(img3, "base-"+b+".img")); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("base %s of an image on disk: %v", b, err)
		}
	}
	if err := os.RemoveAll(img2); err != nil {
		t.Fatal(err)
	}
	r.bases.sweep()
	restore(img3)
}

func checkpointTo(t *testing.T, r *Runtime, id, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.Checkpoint(context.Background(), id, dir, true); err != nil {
		t.Fatalf("checkpoint of %s: %v", id, err)
	}
}

// checkBurst fails t unless s's CPU cgroup may burst a period's quota
// (where the kernel has the file).
func checkBurst(t *testing.T, r *Runtime, s sandbox.Spec) {
	t.Helper()
	dir, file := cpuDir(filepath.Join(r.cfg.CgroupParent, s.RuntimeID)), burstFile()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if os.IsNotExist(err) && dirExists(dir) {
		return
	}
	if want := strconv.FormatInt(cpuQuota(s), 10); err != nil || strings.TrimSpace(string(b)) != want {
		t.Errorf("%s of sandbox %s: %q, %v; want %s", file, s.RuntimeID, strings.TrimSpace(string(b)), err, want)
	}
}

// A Background sandbox's sentry runs in a cgroup of the lowest CPU weight
// until Foreground gives it the normal one.
func TestBackgroundWeight(t *testing.T) {
	r := newTestRuntime(t)
	ctx := context.Background()
	path := func(id string) string { return filepath.Join(r.cfg.CgroupParent, id) }
	shares := func(id string) string {
		t.Helper()
		file := filepath.Join(cgroupRoot, "cpu", path(id), "cpu.shares")
		if v2() {
			file = filepath.Join(cgroupRoot, path(id), "cpu.weight")
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	low, normal := "2", "1024"
	if v2() {
		low, normal = "1", "100" // runsc converts shares to a weight
	}
	bg := spec(t, randomID(), newNet(t), "/bin/sh", "-c", "exec sleep 1000")
	bg.Background = true
	fg := spec(t, randomID(), newNet(t), "/bin/sh", "-c", "exec sleep 1000")
	for _, s := range []sandbox.Spec{bg, fg} {
		if err := r.Prepare(ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Destroy(ctx, s.RuntimeID) })
	}
	// The weight is the sentry's: it runs in the sandbox's cgroup.
	pid, err := os.ReadFile(filepath.Join(bg.BundleDir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	cg, err := os.ReadFile(filepath.Join("/proc", strings.TrimSpace(string(pid)), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cg), path(bg.RuntimeID)+"\n") {
		t.Errorf("the sentry is not in the sandbox's cgroup %s:\n%s", path(bg.RuntimeID), cg)
	}
	// Idle where the kernel has cpu.idle (the weight then reads 3), else
	// the lowest weight.
	idle := func(id string) string {
		b, _ := os.ReadFile(filepath.Join(cpuDir(path(id)), "cpu.idle"))
		return strings.TrimSpace(string(b))
	}
	if got := idle(bg.RuntimeID); got != "1" && got != "" {
		t.Errorf("background sandbox's cpu.idle %q, want 1", got)
	} else if got := shares(bg.RuntimeID); idle(bg.RuntimeID) == "" && got != low {
		t.Errorf("background sandbox's weight %s, want %s", got, low)
	}
	// Its `runsc create` ran in the idle cgroup for such commands.
	if r.bg == "" {
		t.Error("no cgroup for background sandboxes' runsc commands")
	} else if got := idle("background"); got != "1" && idle(bg.RuntimeID) == "1" {
		t.Errorf("cpu.idle of %s is %q, want 1", r.bg, got)
	}
	for _, s := range []sandbox.Spec{bg, fg} {
		if err := r.Foreground(ctx, s.RuntimeID); err != nil {
			t.Fatal(err)
		}
		if got := shares(s.RuntimeID); got != normal {
			t.Errorf("weight %s after Foreground, want %s", got, normal)
		}
		if got := idle(s.RuntimeID); got == "1" {
			t.Error("idle after Foreground")
		}
	}
}
