package agent

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// The agent starts with CAP_SYS_RESOURCE and the process limits of the
// image it booted in (the daemon's maximums). Each sandbox gets its own
// limits at hand-off (POST /init), which may be a restore of an image
// frozen long before: ApplyLimits sets them on the agent, whose children
// inherit them, and lowers them on every process already running (the
// code contexts' kernels, and in a sandbox made from a snapshot whatever
// its user left running). Nobody but the agent can raise a limit.

// DropResourceCapFromChildren removes CAP_SYS_RESOURCE from the bounding set
// of every thread of the agent: the agent keeps it (to set other processes'
// limits) but nothing it executes gets it, root included. Without the
// capability in the bounding set it does nothing.
func DropResourceCapFromChildren() error {
	has, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, unix.CAP_SYS_RESOURCE, 0, 0, 0)
	if err != nil || has == 0 {
		return err
	}
	// The bounding set is per thread, and Go runs on several.
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SYS_RESOURCE, 0); errno != 0 {
		return fmt.Errorf("dropping CAP_SYS_RESOURCE from the bounding set: %w", errno)
	}
	return nil
}

// ProcessLimits are a sandbox's per-process limits (0: leave as is).
type ProcessLimits struct {
	PidsMax   uint64 // RLIMIT_NPROC: processes per user
	OpenFiles uint64 // RLIMIT_NOFILE
}

// ApplyLimits makes l the limits of the agent (soft = hard, so the
// processes it starts from now on cannot raise them) and of every process
// already running, whose limits it lowers to l but never raises: a process
// keeps a lower limit it set itself. procRoot is /proc.
func ApplyLimits(procRoot string, l ProcessLimits) error {
	set := []struct {
		res int
		v   uint64
	}{{unix.RLIMIT_NPROC, l.PidsMax}, {unix.RLIMIT_NOFILE, l.OpenFiles}}
	for _, s := range set {
		if s.v == 0 {
			continue
		}
		// syscall.Setrlimit for NOFILE also stops Go restoring the
		// limit the agent started with in the processes it starts.
		if err := syscall.Setrlimit(s.res, &syscall.Rlimit{Cur: s.v, Max: s.v}); err != nil {
			return fmt.Errorf("setting the agent's limit %d to %d: %w", s.res, s.v, err)
		}
	}
	self := os.Getpid()
	done := map[int]bool{self: true}
	// Another pass for processes forked while the previous one ran (from
	// a parent not yet lowered); a sandbox being handed off is quiet.
	for range 4 {
		pids, err := listPids(procRoot)
		if err != nil {
			return err
		}
		fresh := false
		for _, pid := range pids {
			if done[pid] {
				continue
			}
			done[pid], fresh = true, true
			for _, s := range set {
				if s.v == 0 {
					continue
				}
				if err := lower(pid, s.res, s.v); err != nil {
					return fmt.Errorf("lowering limit %d of process %d: %w", s.res, pid, err)
				}
			}
		}
		if !fresh {
			return nil
		}
	}
	return nil
}

// lower sets pid's limit res to at most v (soft and hard).
func lower(pid, res int, v uint64) error {
	var old unix.Rlimit
	if err := unix.Prlimit(pid, res, nil, &old); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil // exited meanwhile
		}
		return err
	}
	nl := unix.Rlimit{Max: min(old.Max, v)}
	nl.Cur = min(old.Cur, nl.Max)
	if nl == old {
		return nil
	}
	if err := unix.Prlimit(pid, res, &nl, nil); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

// listPids returns the processes in procRoot.
func listPids(procRoot string) ([]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
