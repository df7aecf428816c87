package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

func startSleep(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid
}

func nofile(t *testing.T, pid int) unix.Rlimit {
	t.Helper()
	var l unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &l); err != nil {
		t.Fatal(err)
	}
	return l
}

// ApplyLimits sets the agent's own limits and lowers, never raises, those
// of the other processes it finds.
func TestApplyLimitsLowersOthers(t *testing.T) {
	self := nofile(t, 0)
	v := min(self.Max, 4096)
	if v < 200 {
		t.Skipf("open-file limit %d too low to test with", self.Max)
	}
	plain, lowered := startSleep(t), startSleep(t)
	if err := unix.Prlimit(lowered, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 100, Max: 100}, nil); err != nil {
		t.Fatal(err)
	}
	before := nofile(t, plain)
	proc := t.TempDir() // a /proc with just these two (and a non-process entry)
	for _, name := range []string{strconv.Itoa(plain), strconv.Itoa(lowered), "self", strconv.Itoa(1 << 30)} {
		if err := os.Mkdir(filepath.Join(proc, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := ApplyLimits(proc, ProcessLimits{OpenFiles: v}); err != nil {
		t.Fatal(err)
	}
	if got := nofile(t, 0); got.Cur != v || got.Max != v {
		t.Errorf("own limit %+v, want %d/%d", got, v, v)
	}
	want := unix.Rlimit{Max: min(before.Max, v)}
	want.Cur = min(before.Cur, want.Max)
	if got := nofile(t, plain); got != want {
		t.Errorf("other process: %+v, want %+v (was %+v)", got, want, before)
	}
	if got := nofile(t, lowered); got.Cur != 100 || got.Max != 100 {
		t.Errorf("a process's own lower limit was raised: %+v", got)
	}
}
