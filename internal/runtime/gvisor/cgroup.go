package gvisor

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
)

const cgroupRoot = "/sys/fs/cgroup"

// v2 reports whether the host uses the unified cgroup hierarchy.
func v2() bool {
	_, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers"))
	return err == nil
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// readKey reads "key value" lines (memory.stat, cpu.stat).
func readKey(path, key string) uint64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	return 0
}

func readCgroupStats(path string) (sandbox.Stats, error) {
	var st sandbox.Stats
	if v2() {
		dir := filepath.Join(cgroupRoot, path)
		mem, err := readUint(filepath.Join(dir, "memory.current"))
		if err != nil {
			return st, err
		}
		st.MemoryBytes = mem
		st.MemoryCache = readKey(filepath.Join(dir, "memory.stat"), "file")
		st.CPUUsage = time.Duration(readKey(filepath.Join(dir, "cpu.stat"), "usage_usec")) * time.Microsecond
		return st, nil
	}
	mem, err := readUint(filepath.Join(cgroupRoot, "memory", path, "memory.usage_in_bytes"))
	if err != nil {
		return st, err
	}
	st.MemoryBytes = mem
	st.MemoryCache = readKey(filepath.Join(cgroupRoot, "memory", path, "memory.stat"), "cache")
	cpu, _ := readUint(filepath.Join(cgroupRoot, "cpuacct", path, "cpuacct.usage"))
	st.CPUUsage = time.Duration(cpu)
	return st, nil
}

// writeCgroupPids sets pids.max of the sandbox's pids cgroup.
func writeCgroupPids(path string, n int64) error {
	file := filepath.Join(cgroupRoot, "pids", path, "pids.max")
	if v2() {
		file = filepath.Join(cgroupRoot, path, "pids.max")
	}
	return os.WriteFile(file, []byte(strconv.FormatInt(n, 10)), 0)
}

// writeCgroupNormalWeight gives the sandbox's cgroup the default CPU
// weight (v1 cpu.shares, v2 cpu.weight) and takes it out of idle.
func writeCgroupNormalWeight(path string) error {
	dir, file, v := cpuDir(path), "cpu.shares", "1024"
	if v2() {
		file, v = "cpu.weight", "100"
	}
	if err := writeCgroupIdle(dir, false); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, file), []byte(v), 0)
}

// writeCgroupIdle makes the tasks of a CPU cgroup directory idle (Linux
// 5.15's cpu.idle): any other task that wakes takes the CPU from them at
// once, where the lowest weight alone still let one run out its slice.
// A kernel without cpu.idle is no error.
func writeCgroupIdle(dir string, idle bool) error {
	v := "0"
	if idle {
		v = "1"
	}
	return writeIfKernelHas(dir, "cpu.idle", v)
}

// writeCgroupBurst lets the tasks of a CPU cgroup directory spend, on top
// of a period's quota, up to us of the quota they left unused in earlier
// periods (Linux 5.14's cpu.cfs_burst_us, v2 cpu.max.burst; at most the
// quota). A sandbox idle between commands then runs one on every CPU
// instead of being frozen for the rest of the period once its quota is
// spent. A kernel without it is no error.
func writeCgroupBurst(dir string, us int64) error {
	return writeIfKernelHas(dir, burstFile(), strconv.FormatInt(us, 10))
}

func burstFile() string {
	if v2() {
		return "cpu.max.burst"
	}
	return "cpu.cfs_burst_us"
}

// writeIfKernelHas writes a cgroup file that an older kernel does not
// have: its absence from a directory that exists is no error.
func writeIfKernelHas(dir, file, v string) error {
	err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0)
	if errors.Is(err, os.ErrNotExist) && dirExists(dir) {
		return nil
	}
	return err
}

func dirExists(dir string) bool {
	st, err := os.Stat(dir)
	return err == nil && st.IsDir()
}

// cpuDir is the CPU controller's directory of a cgroup path.
func cpuDir(path string) string {
	if v2() {
		return filepath.Join(cgroupRoot, path)
	}
	return filepath.Join(cgroupRoot, "cpu", path)
}

// removeCgroups removes the sandbox's (empty) cgroup directories, which a
// failed start can leave behind.
func removeCgroups(path string) {
	if v2() {
		_ = os.Remove(filepath.Join(cgroupRoot, path))
		return
	}
	entries, _ := os.ReadDir(cgroupRoot)
	for _, e := range entries {
		_ = os.Remove(filepath.Join(cgroupRoot, e.Name(), path))
	}
}
