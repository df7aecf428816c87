// Package sandbox holds cellfork's domain types and the small interfaces the
// manager depends on. It has no implementations: runtime/gvisor, netns and
// store implement them and import this package, never the reverse.
package sandbox

import (
	"context"
	"time"
)

// State of a sandbox as the API reports it.
type State string

// States.
const (
	StateRunning State = "running"
	StatePaused  State = "paused"
)

// Sandbox is the durable record of one sandbox.
type Sandbox struct {
	ID          string
	Team        string // the team it belongs to ("" on a single host)
	TemplateID  string // as the caller asked for it (alias kept)
	RuntimeID   string // runsc container id; fixed length, never a prefix of another
	State       State
	StartedAt   time.Time
	EndAt       time.Time
	Metadata    map[string]string
	Envs        map[string]string
	CPUCount    int
	MemoryMB    int
	DiskSizeMB  int
	PidsMax     int    // 0 in records of older daemons: see Limits
	OpenFiles   int    // 0 in records of older daemons: see Limits
	AccessToken string // envd access token (X-Access-Token)
	OnTimeout   string // "kill" or "pause"
	// AutoResume (with OnTimeout "pause"): a data-plane request to the
	// paused sandbox resumes it, as E2B's lifecycle.autoResume.
	AutoResume bool
	// AutoPauseFiles (with OnTimeout "pause"): the timeout pauses it
	// filesystem-only (E2B's autoPauseMemory false).
	AutoPauseFiles bool
	// Rootfs is the template root filesystem the sandbox runs on; restores
	// of its state need the same one.
	Rootfs string
	// ParentID is the sandbox this one was forked from ("" if none).
	ParentID string
	// BaseSnapshot is the snapshot the sandbox's state last came from or
	// was last saved to: the parent of its next snapshot.
	BaseSnapshot string
	// PausedImage is where a sandbox paused to disk keeps its state ("" if
	// it runs, is paused in memory, or its image is in the chunk store
	// only). PausedRoot names that image in the chunk store once it is
	// uploaded there; the disk's copy is then dropped, and a resume (here,
	// or on another host of a cluster) imports it again.
	PausedImage string
	PausedRoot  string
	// PauseMode says what a paused sandbox's pause saved: PauseFull (its
	// memory and files; "" in records of older daemons) or PauseFiles (its
	// files only: resuming boots it afresh from them). "" while it runs.
	PauseMode string
	// BootMode says how the sandbox was started: "pool", "restore" or
	// "boot".
	BootMode string
	// Network is the sandbox's network policy.
	Network Network
}

// What a pause saves (E2B's SandboxPauseMode).
const (
	PauseFull  = "full"
	PauseFiles = "filesystem"
)

// Network is a sandbox's network policy, as E2B's API states it. Egress to
// the host, the daemon, other sandboxes and link-local addresses is denied
// whatever it says.
type Network struct {
	AllowInternet      bool     // public destinations not in DenyOut
	AllowOut           []string // IPv4 addresses, CIDRs (allowed even if private or denied) and domain names
	DenyOut            []string // IPv4 addresses and CIDRs denied
	DNSServers         []string // with domain rules: IPv4 addresses also allowed, as E2B does for resolvers
	AllowPublicTraffic bool     // user ports reachable without the traffic token
	// Rules (E2B's network.rules) set headers on the sandbox's HTTPS
	// requests to matching hosts, by domain ("api.example.com", or
	// "*.example.com" for its subdomains): the daemon's proxy terminates
	// TLS for those names and adds them, so a secret in a header never
	// enters the sandbox. They grant no access: the rules above decide.
	Rules map[string]Transform
	// MaskRequestHost (E2B's; ingress, set at create) is the Host header
	// data-plane requests to user ports carry into the sandbox, with
	// "${PORT}" replaced by the port ("": the caller's own).
	MaskRequestHost string
}

// DefaultNetwork is E2B's default: internet on, ports public.
var DefaultNetwork = Network{AllowInternet: true, AllowPublicTraffic: true}

// Snapshot is the durable record of a saved sandbox state. Snapshots form a
// tree through ParentID.
type Snapshot struct {
	ID         string
	Team       string // the team it belongs to ("" on a single host)
	Names      []string
	ParentID   string // snapshot the source sandbox's state came from
	SandboxID  string // sandbox it was taken from
	TemplateID string // template of that sandbox
	Rootfs     string
	Image      string // checkpoint image directory
	SizeBytes  int64
	CreatedAt  time.Time
	// Envs and limits of the source sandbox, which a sandbox created from
	// the snapshot inherits. The disk size and the process limits are
	// frozen in the image (0: taken by an older daemon, unknown).
	Envs      map[string]string
	CPUCount  int
	MemoryMB  int
	DiskMB    int
	PidsMax   int
	OpenFiles int
	Network   Network
	// Upload is where the image is in the chunk store (empty: the daemon
	// has no store, or the snapshot predates it). StoreRoot names its
	// manifest once uploaded; a snapshot whose Image is gone is imported
	// from it. UploadError says why an upload failed.
	Upload      UploadState
	StoreRoot   string
	UploadError string
	// Runtime is the runtime build that wrote the image (only that build
	// restores it; "" in records of older daemons).
	Runtime string
}

// UploadState is how far a snapshot's image is in the chunk store.
type UploadState string

const (
	UploadPending UploadState = "uploading" // exported in the background, retried until it succeeds
	UploadDone    UploadState = "uploaded"  // StoreRoot names its manifest
	UploadFailed  UploadState = "failed"    // terminal (its image is corrupt or gone); UploadError says why
)

// Limits returns the sandbox's limits (0 where its record does not say).
func (s *Sandbox) Limits() Limits {
	return Limits{CPUCount: s.CPUCount, MemoryMB: s.MemoryMB, DiskMB: s.DiskSizeMB, PidsMax: s.PidsMax, OpenFiles: s.OpenFiles}
}

// SetLimits records l as the sandbox's limits.
func (s *Sandbox) SetLimits(l Limits) {
	s.CPUCount, s.MemoryMB, s.DiskSizeMB, s.PidsMax, s.OpenFiles = l.CPUCount, l.MemoryMB, l.DiskMB, l.PidsMax, l.OpenFiles
}

// Limits returns the limits the snapshot's sandbox had (0 where unknown).
func (s *Snapshot) Limits() Limits {
	return Limits{CPUCount: s.CPUCount, MemoryMB: s.MemoryMB, DiskMB: s.DiskMB, PidsMax: s.PidsMax, OpenFiles: s.OpenFiles}
}

// Spec is what the runtime needs to start a sandbox.
type Spec struct {
	RuntimeID string
	BundleDir string   // per-sandbox directory for the OCI bundle and logs, named RuntimeID
	Rootfs    string   // read-only lower layer; writes stay in sandbox memory
	Args      []string // init process (the agent)
	Env       []string
	NetnsPath string
	// Limits: CPUCount, MemoryMB and PidsMax size the host's cgroups
	// (PidsMax with headroom for gVisor's own threads); DiskMB bounds the
	// writable root and /dev/shm of a sandbox started (or prepared) from
	// scratch; a restored one keeps its image's. PidsMax and OpenFiles are
	// not given to processes: see InitRlimits.
	Limits Limits
	// RootfsUpper is a tar ExportRootfs wrote: the root filesystem starts
	// with those changes over Rootfs ("" none). Only for Start.
	RootfsUpper string
	// InitRlimits are the RLIMIT_NPROC (PidsMax) and RLIMIT_NOFILE
	// (OpenFiles) the init process starts with and passes on; a restored
	// sandbox keeps its image's. Zero fields: Limits'; other fields are
	// unused.
	InitRlimits Limits
	// WritableRoot makes the sandbox write straight to Rootfs instead of an
	// in-memory overlay (a template build step, whose Rootfs is the step's
	// own overlay mount). Such a sandbox is never checkpointed.
	WritableRoot bool
	// Background runs the sandbox, and the runtime's commands for it, as
	// idle CPU work (the lowest weight where the host has no idle
	// scheduling) while it is made ahead of need (a pool's shells and
	// ready sandboxes): it takes only CPU time running sandboxes leave.
	// Foreground ends that.
	Background bool
}

// Stats is one resource-usage sample.
type Stats struct {
	CPUUsage    time.Duration // cumulative CPU time
	MemoryBytes uint64
	MemoryCache uint64
}

// RuntimeUnsure is the Runtime.State of a sandbox a crash caught in the
// middle of a pause or resume: it may be frozen, and whether Resume would
// thaw it is unknown. It can still be checkpointed and destroyed.
const RuntimeUnsure = "unsure"

// Runtime starts and stops isolated sandboxes. Implementations must be safe
// for concurrent use.
type Runtime interface {
	// Start boots a sandbox and returns once its init process runs.
	Start(ctx context.Context, s Spec) error
	// Prepare creates a sandbox that runs nothing yet, to Restore into.
	Prepare(ctx context.Context, s Spec) error
	// Restore starts a sandbox from a checkpoint image, into the Prepared
	// sandbox s.RuntimeID if prepared, else into a new one.
	Restore(ctx context.Context, s Spec, image string, prepared bool) error
	// Checkpoint saves the sandbox's whole state into the empty dir. Unless
	// leaveRunning, the sandbox stops and must then be Destroyed.
	Checkpoint(ctx context.Context, runtimeID, dir string, leaveRunning bool) error
	// ExportRootfs writes what the sandbox changed in its root filesystem
	// (the overlay's upper layer, deletions included) as a tar to path, a
	// new file; a sandbox started with Spec.RootfsUpper = path starts with
	// those changes.
	ExportRootfs(ctx context.Context, runtimeID, path string) error
	// Pause freezes the sandbox in memory; Resume thaws it.
	Pause(ctx context.Context, runtimeID string) error
	Resume(ctx context.Context, runtimeID string) error
	// Destroy kills the sandbox and frees everything the runtime holds for
	// it. Destroying a sandbox that does not exist is not an error.
	Destroy(ctx context.Context, runtimeID string) error
	// State returns the runtime's status ("created", "running", "paused",
	// "stopped", RuntimeUnsure), or "" if the sandbox does not exist.
	State(ctx context.Context, runtimeID string) (string, error)
	// List returns the runtime ids of every sandbox the runtime knows.
	List(ctx context.Context) ([]string, error)
	// Stats samples resource usage.
	Stats(ctx context.Context, runtimeID string) (Stats, error)
	// SetPidsMax changes the host's bound on the threads and processes of a
	// running sandbox to fit pidsMax processes inside (the one limit of
	// Spec.Limits that can change without the sandbox noticing).
	SetPidsMax(ctx context.Context, runtimeID string, pidsMax int) error
	// Foreground gives a sandbox started with Spec.Background the normal
	// CPU share; on any other it changes nothing.
	Foreground(ctx context.Context, runtimeID string) error
	// Watch calls onExit once when the sandbox (started with bundleDir)
	// exits, whatever the cause (its own Destroy included).
	Watch(ctx context.Context, bundleDir string, onExit func()) error
}

// Store persists sandbox and snapshot records. Implementations must be
// safe for concurrent use; every Put is atomic.
type Store interface {
	Put(ctx context.Context, s *Sandbox) error
	Get(ctx context.Context, id string) (*Sandbox, error) // errdefs.ErrNotFound if absent
	List(ctx context.Context) ([]*Sandbox, error)
	Delete(ctx context.Context, id string) error
	PutSnapshot(ctx context.Context, s *Snapshot) error
	GetSnapshot(ctx context.Context, id string) (*Snapshot, error) // errdefs.ErrNotFound if absent
	ListSnapshots(ctx context.Context) ([]*Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
}
