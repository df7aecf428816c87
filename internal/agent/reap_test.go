package agent

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// As PID 1 of a sandbox, the agent adopts every orphan; a child subreaper
// stands in for that here.
func TestReapOrphansLeavesOurChildren(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	ours := exec.Command("sleep", "0.05")
	if err := StartChild(ours); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sh", "-c", "sleep 0.05 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	orphan, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	time.Sleep(300 * time.Millisecond) // both have exited: zombies now
	if state, ppid, ok := procStat("/proc/" + strconv.Itoa(orphan) + "/stat"); !ok || state != 'Z' || ppid != os.Getpid() {
		t.Fatalf("the orphan %d is not our zombie (state %c, parent %d)", orphan, state, ppid)
	}
	reapOrphans("/proc")
	if _, err := os.Stat("/proc/" + strconv.Itoa(orphan)); err == nil {
		t.Error("the orphan's zombie was not reaped")
	}
	if err := ours.Wait(); err != nil {
		t.Errorf("our own child was reaped from under os/exec: %v", err)
	}
	ChildDone(ours.Process.Pid)
}

func TestProcStat(t *testing.T) {
	dir := t.TempDir()
	f := dir + "/stat"
	os.WriteFile(f, []byte("42 (a (weird) name) Z 1 42 42 0 -1"), 0o644)
	if state, ppid, ok := procStat(f); !ok || state != 'Z' || ppid != 1 {
		t.Fatalf("procStat = %c %d %v", state, ppid, ok)
	}
}
