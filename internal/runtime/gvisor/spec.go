package gvisor

import (
	"fmt"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// The OCI runtime spec subset runsc reads. Declared here rather than
// importing the whole runtime-spec module for a dozen fields.
type ociConfig struct {
	OCIVersion string     `json:"ociVersion"`
	Process    ociProcess `json:"process"`
	Root       ociRoot    `json:"root"`
	Hostname   string     `json:"hostname"`
	Mounts     []ociMount `json:"mounts"`
	Linux      ociLinux   `json:"linux"`
	// Annotations: runsc's dev.gvisor.tar.rootfs.upper seeds the root
	// overlay's upper layer from a tar at boot.
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ociProcess struct {
	Terminal     bool            `json:"terminal"`
	User         ociUser         `json:"user"`
	Args         []string        `json:"args"`
	Env          []string        `json:"env"`
	Cwd          string          `json:"cwd"`
	Capabilities ociCapabilities `json:"capabilities"`
	Rlimits      []ociRlimit     `json:"rlimits"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCapabilities struct {
	Bounding  []string `json:"bounding"`
	Effective []string `json:"effective"`
	Permitted []string `json:"permitted"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces  []ociNamespace `json:"namespaces"`
	Resources   ociResources   `json:"resources"`
	CgroupsPath string         `json:"cgroupsPath"`
}

type ociNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

type ociResources struct {
	Memory ociMemory `json:"memory"`
	CPU    ociCPU    `json:"cpu"`
	Pids   ociPids   `json:"pids"`
}

type ociMemory struct {
	Limit int64 `json:"limit"`
}

type ociCPU struct {
	Quota  int64  `json:"quota"`
	Period uint64 `json:"period"`
	Shares uint64 `json:"shares,omitempty"`
}

type ociPids struct {
	Limit int64 `json:"limit"`
}

// caps is what the agent (root inside the sandbox) needs to run processes
// as other users and manage their files: Docker's default set. Processes it
// starts as non-root users lose them. CAP_SYS_RESOURCE lets the agent set
// every process's limits to the sandbox's at hand-off; it drops it from its
// bounding set when it starts, so that nothing it runs (root included) gets
// it.
var caps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	"CAP_SYS_RESOURCE",
}

const cpuPeriod = 100000 // µs

// cpuQuota is the sandbox's CPU time per cpuPeriod, in µs.
func cpuQuota(s sandbox.Spec) int64 { return int64(s.Limits.CPUCount) * cpuPeriod }

// sharesBackground is the CPU weight (cgroup v1 cpu.shares; runsc converts
// it for v2) of a Background sandbox: the lowest the kernel takes, 1/512
// of a running sandbox's when both want the CPUs.
const sharesBackground = 2

// hostPids is the host pids cgroup limit of a sandbox that allows pidsMax
// processes inside. It bounds gVisor's own threads and systrap stub
// processes, not the sandbox's processes (RLIMIT_NPROC does that inside):
// it needs headroom, or a fork bomb starves the sentry of threads and kills
// it.
func hostPids(pidsMax int) int64 { return int64(4*pidsMax + 1024) }

// shares is a sandbox's CPU weight in its spec: 0 leaves the default.
func shares(background bool) uint64 {
	if background {
		return sharesBackground
	}
	return 0
}

// shmMount is /dev/shm: a tmpfs in sandbox memory, like the root overlay,
// of half the disk size (as Linux sizes a tmpfs at half of RAM), so that
// filling both stays within a memory limit twice the disk size. gVisor
// honours size= on a tmpfs the spec names (not on the /tmp it adds).
func shmMount(diskMB int) ociMount {
	m := ociMount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm"}
	if diskMB > 0 {
		m.Options = []string{fmt.Sprintf("size=%dm", max(diskMB/2, 1))}
	}
	return m
}

func ociSpec(s sandbox.Spec, cgroupsPath string) ociConfig {
	rl := s.Limits.Over(s.InitRlimits)
	return ociConfig{
		OCIVersion: "1.0.0",
		Process: ociProcess{
			Args:         s.Args,
			Env:          s.Env,
			Cwd:          "/",
			Capabilities: ociCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			// gVisor enforces both for every process without CAP_SYS_ADMIN
			// or CAP_SYS_RESOURCE (none but the agent has one): a fork bomb
			// stops at PidsMax per user instead of exhausting the sandbox.
			Rlimits: []ociRlimit{
				{Type: "RLIMIT_NOFILE", Hard: uint64(rl.OpenFiles), Soft: uint64(rl.OpenFiles)},
				{Type: "RLIMIT_NPROC", Hard: uint64(rl.PidsMax), Soft: uint64(rl.PidsMax)},
			},
		},
		Root:     ociRoot{Path: s.Rootfs},
		Hostname: "sandbox",
		Mounts: []ociMount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts"},
			shmMount(s.Limits.DiskMB),
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"ro", "nosuid", "noexec", "nodev"}},
		},
		Linux: ociLinux{
			Namespaces: []ociNamespace{
				{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"},
				{Type: "network", Path: s.NetnsPath},
			},
			Resources: ociResources{
				Memory: ociMemory{Limit: int64(s.Limits.MemoryMB) << 20},
				CPU:    ociCPU{Quota: cpuQuota(s), Period: cpuPeriod, Shares: shares(s.Background)},
				Pids:   ociPids{Limit: hostPids(s.Limits.PidsMax)},
			},
			CgroupsPath: cgroupsPath,
		},
		Annotations: rootfsUpper(s.RootfsUpper),
	}
}

// rootfsUpper is the annotation that makes runsc seed the root overlay's
// upper layer from the tar at path (runsc/specutils AnnotationRootfsUpperTar).
func rootfsUpper(path string) map[string]string {
	if path == "" {
		return nil
	}
	return map[string]string{"dev.gvisor.tar.rootfs.upper": path}
}
