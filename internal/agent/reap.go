package agent

import (
	"bytes"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The agent is PID 1 of its sandbox, so every orphaned process (`sleep 10
// &` outliving its shell) becomes its child, and nothing else would reap
// it: the zombies would pile up, each holding a pid against the sandbox's
// process limit. ReapOrphans reaps the children the agent did not start
// itself; those it did (StartChild) are left to os/exec's Wait.

var children = struct {
	sync.Mutex
	ours map[int]bool
}{ours: map[int]bool{}}

// StartChild starts cmd as a child the agent waits for itself. Call
// ChildDone once cmd.Wait has returned.
func StartChild(cmd *exec.Cmd) error {
	children.Lock()
	defer children.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	children.ours[cmd.Process.Pid] = true
	return nil
}

// ChildDone forgets a child started by StartChild, once waited for.
func ChildDone(pid int) {
	children.Lock()
	delete(children.ours, pid)
	children.Unlock()
}

// reapDelay batches the reaping after a burst of exits.
const reapDelay = 50 * time.Millisecond

// ReapOrphans reaps exited orphans for as long as the process lives (start
// it in PID 1 only).
func ReapOrphans() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	for range ch {
		time.Sleep(reapDelay)
		reapOrphans("/proc")
	}
}

// reapOrphans waits for every zombie child of this process that it did not
// start through StartChild.
func reapOrphans(procRoot string) {
	self := os.Getpid()
	pids, _ := listPids(procRoot)
	children.Lock()
	defer children.Unlock()
	for _, pid := range pids {
		state, ppid, ok := procStat(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
		if !ok || ppid != self || state != 'Z' || children.ours[pid] {
			continue
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}

// procStat reads the state and parent pid of a /proc/<pid>/stat.
func procStat(path string) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	fields := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
	if len(fields) < 2 || len(fields[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(string(fields[1]))
	return fields[0][0], ppid, err == nil
}
