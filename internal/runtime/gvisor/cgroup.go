package gvisor

import (
	"bufio"
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
