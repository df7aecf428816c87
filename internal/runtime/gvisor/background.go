package gvisor

import (
	"os"
	"path/filepath"
)

// backgroundCgroup makes the idle CPU cgroup in which the runsc commands of
// Background sandboxes run (a shell's `runsc create`): a pool's refill
// spent about as much CPU in runsc's own processes as in its sandboxes
// (perf, two ready sandboxes and their shells refilled: 250 of 640 ms).
// The sandbox and gofer processes a command starts go to the sandbox's own
// cgroup. It returns the cgroup's cgroup.procs, or "" where it cannot be
// made: such commands then run at the normal share. A command is never
// moved back, and the restore waiting beside a shell (ahead.go) is never
// moved: its work is a request's, and a move out of a cgroup can wait for
// an RCU grace period (9 ms measured) on the request's path.
func backgroundCgroup(parent string) string {
	dir := cpuDir(filepath.Join(parent, "background"))
	if os.MkdirAll(dir, 0o755) != nil || writeCgroupIdle(dir, true) != nil {
		return ""
	}
	return filepath.Join(dir, "cgroup.procs")
}
