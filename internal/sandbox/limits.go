package sandbox

import "fmt"

// Limits are the resources of one sandbox. A zero field means "not set"
// wherever Limits are layered (daemon defaults, then the template's
// values, then the create's).
type Limits struct {
	CPUCount  int // CPUs (cgroup CPU quota)
	MemoryMB  int // memory, MiB (cgroup); also what the sandbox sees as total
	DiskMB    int // writable root filesystem, MiB (in sandbox memory; /dev/shm gets half as much)
	PidsMax   int // processes per user inside the sandbox (RLIMIT_NPROC)
	OpenFiles int // open files per process (RLIMIT_NOFILE)
}

// LimitNames are the API names of the limits, in the order of Limits' fields.
var LimitNames = []string{"cpuCount", "memoryMB", "diskSizeMB", "pidsMax", "openFiles"}

// Field returns a pointer to the limit the API calls name, or nil.
func (l *Limits) Field(name string) *int {
	switch name {
	case "cpuCount":
		return &l.CPUCount
	case "memoryMB":
		return &l.MemoryMB
	case "diskSizeMB":
		return &l.DiskMB
	case "pidsMax":
		return &l.PidsMax
	case "openFiles":
		return &l.OpenFiles
	}
	return nil
}

// Over returns l with every field that o sets (non-zero) taken from o.
func (l Limits) Over(o Limits) Limits {
	for _, n := range LimitNames {
		if v := *o.Field(n); v != 0 {
			*l.Field(n) = v
		}
	}
	return l
}

// MinLimits are the smallest values a sandbox can run with. The agent,
// which serves every request inside, lives under the sandbox's open-file
// limit too: it needs a few hundred.
var MinLimits = Limits{CPUCount: 1, MemoryMB: 128, DiskMB: 16, PidsMax: 16, OpenFiles: 256}

// MaxOpenFiles is the most open files gVisor allows a process (its fs.nr_open).
const MaxOpenFiles = 1 << 20

// Check returns an error naming the first limit that is not set or lies
// outside [MinLimits, max].
func (l Limits) Check(max Limits) error {
	lo := MinLimits
	for _, n := range LimitNames {
		v, min, hi := *l.Field(n), *lo.Field(n), *max.Field(n)
		if v < min || v > hi {
			return fmt.Errorf("%s must be between %d and %d, not %d", n, min, hi, v)
		}
	}
	return nil
}

// SameSize reports whether a box started with limits l serves a sandbox
// with limits o without gVisor noticing: same CPUs and memory (which
// gVisor reads once, when the box starts or is prepared).
func (l Limits) SameSize(o Limits) bool {
	return l.CPUCount == o.CPUCount && l.MemoryMB == o.MemoryMB
}
