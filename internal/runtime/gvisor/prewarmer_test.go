package gvisor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// procStatus is the fields of a /proc/<pid>/status.
func procStatus(t *testing.T, text string) map[string]string {
	t.Helper()
	f := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			f[k] = strings.TrimSpace(v)
		}
	}
	return f
}

// fdTable is the host fd table size the prewarmer grows to: 4,096, or the
// hard RLIMIT_NOFILE if lower.
func fdTable(t *testing.T) int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	return int(min(4096, rl.Max))
}

func hexField(t *testing.T, f map[string]string, k string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(f[k], 16, 64)
	if err != nil {
		t.Fatalf("%s %q: %v", k, f[k], err)
	}
	return v
}

// TestPrewarmer builds the sentry's prewarmer sidecar as build-runsc.sh does
// and runs cat through it: the bounding set is trimmed to --capbset's mask
// while every permitted capability survives the exec, the fd table is
// grown ahead, and a bad mask refuses to exec.
func TestPrewarmer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the prewarmer test needs root (CAP_SETPCAP)")
	}
	bin := filepath.Join(t.TempDir(), "prewarmer")
	if out, err := exec.Command("cc", "-O2", "-o", bin, "prewarmer/prewarmer.c").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	self, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	mine := procStatus(t, string(self))
	full, prm := hexField(t, mine, "CapBnd"), hexField(t, mine, "CapPrm")
	run := func(args ...string) (map[string]string, error) {
		cmd := exec.Command(bin, append(args, "/bin/cat", "cat", "/proc/self/status")...)
		out, err := cmd.Output()
		return procStatus(t, string(out)), err
	}

	const keep = 0x8001f // directfs's five and CAP_SYS_PTRACE: the sandbox's
	f, err := run("--capbset=0x8001f")
	if err != nil {
		t.Fatal(err)
	}
	if got := hexField(t, f, "CapBnd"); got != full&keep {
		t.Errorf("CapBnd = %#x through --capbset=%#x, want %#x", got, keep, full&keep)
	}
	// What the sentry needs before it applies its own capabilities (its
	// chroot) stays permitted and effective across the exec.
	for _, k := range []string{"CapPrm", "CapEff"} {
		if got := hexField(t, f, k); got != prm {
			t.Errorf("%s = %#x through --capbset, want %#x (this process's permitted set)", k, got, prm)
		}
	}
	if n, _ := strconv.Atoi(f["FDSize"]); n < fdTable(t) {
		t.Errorf("FDSize = %s, want at least %d (the fd table grown before the exec)", f["FDSize"], fdTable(t))
	}

	f, err = run()
	if err != nil {
		t.Fatal(err)
	}
	if got := hexField(t, f, "CapBnd"); got != full {
		t.Errorf("CapBnd = %#x without --capbset, want it untouched (%#x)", got, full)
	}

	for _, bad := range []string{"--capbset=", "--capbset=0x8001fz", "--capbset=nope"} {
		if _, err := run(bad); err == nil {
			t.Errorf("%s: exec'd; want exit status 127", bad)
		} else if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 127 {
			t.Errorf("%s: %v, want exit status 127", bad, err)
		}
	}
}

// TestSandboxProcessCaps: a running sandbox's sentry holds only the
// capabilities it needs, in every set, on every thread (the prewarmer
// trimmed its bounding set before the exec, the sentry the rest), and its
// host fd table was grown before the restore that needs it.
func TestSandboxProcessCaps(t *testing.T) {
	r := newTestRuntime(t)
	ctx := context.Background()
	id := randomID()
	s := spec(t, id, newNet(t), "/bin/sleep", "1000")
	if err := r.Start(ctx, s); err != nil {
		t.Fatal(err)
	}
	defer r.Destroy(ctx, id)
	pid, err := os.ReadFile(filepath.Join(s.BundleDir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/" + strings.TrimSpace(string(pid)) + "/task")
	if err != nil || len(tasks) < 2 {
		t.Fatalf("sentry threads: %d, %v", len(tasks), err)
	}
	const want = 0x8001f // directfs's five and CAP_SYS_PTRACE (systrap)
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/task/" + task.Name() + "/status")
		if err != nil {
			continue // the thread exited
		}
		f := procStatus(t, string(b))
		for _, k := range []string{"CapBnd", "CapEff", "CapPrm"} {
			if got := hexField(t, f, k); got != want {
				t.Errorf("thread %s: %s = %#x, want %#x", task.Name(), k, got, want)
			}
		}
		if got := hexField(t, f, "CapInh") | hexField(t, f, "CapAmb"); got != 0 {
			t.Errorf("thread %s: inheritable or ambient capabilities %#x, want none", task.Name(), got)
		}
		if n, _ := strconv.Atoi(f["FDSize"]); n < fdTable(t) {
			t.Errorf("thread %s: FDSize = %s, want at least %d", task.Name(), f["FDSize"], fdTable(t))
		}
	}
}
