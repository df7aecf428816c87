package sandbox

import (
	"context"
	"net/http"
	"time"
)

// CreateRequest is what a caller may choose about a new sandbox. Zero values
// mean the defaults.
type CreateRequest struct {
	// ID is the id to create it under (minted by the gateway that placed
	// it: IDs.Own); "" mints one. A create with the id of a sandbox that
	// exists answers that sandbox: creates are idempotent by id.
	ID         string
	TemplateID string
	Timeout    time.Duration
	Metadata   map[string]string
	Envs       map[string]string
	// Limits the caller asks for; zero fields take the source's (the
	// template's defaults, or the snapshot's).
	Limits    Limits
	OnTimeout string // "kill" (default) or "pause"
	// AutoResume: traffic to the paused sandbox resumes it (needs OnTimeout
	// "pause", as in E2B).
	AutoResume bool
	// Network is the policy; nil means the snapshot's, or the default.
	Network *Network
	// AutoPauseFiles: a timeout pause saves the files only (E2B's
	// autoPauseMemory false). Not with AutoResume.
	AutoPauseFiles bool
	// ParentID makes it a fork child of that sandbox: a cluster's fork
	// child made on another host than its parent's, from the parent's
	// state (a gateway's; a merge takes it back).
	ParentID string
}

// ForkResult is one child of a fork: a sandbox or an error.
type ForkResult struct {
	Sandbox *Sandbox
	Err     error
}

// Metric is one resource-usage sample of a sandbox.
type Metric struct {
	At         time.Time
	CPUCount   int
	CPUUsedPct float64
	MemUsed    uint64
	MemTotal   uint64
	MemCache   uint64
	DiskUsed   uint64
	DiskTotal  uint64
}

// NetworkStatus is a sandbox's policy and how many connection attempts it
// has refused.
type NetworkStatus struct {
	Policy Network
	Denied uint64
}

// PauseRequest says how to pause.
type PauseRequest struct {
	// Spill writes the state to disk now (freeing memory) instead of after
	// the daemon's spill delay; pausing a paused sandbox with Spill moves
	// it to disk.
	Spill bool
	// FilesOnly saves the files and not the memory (E2B's memory false):
	// resuming boots the sandbox afresh from them. It needs the sandbox's
	// agent to answer.
	FilesOnly bool
	// RequireHealthyAgent refuses the pause (ErrUnavailable) while the
	// sandbox's agent does not answer (E2B's requireHealthyGuest).
	RequireHealthyAgent bool
}

// ConnectRequest says how to connect to a sandbox.
type ConnectRequest struct {
	// Timeout extends the sandbox's life to at least this from now (0:
	// the default lifetime if it resumes, unchanged if it runs).
	Timeout time.Duration
	// MustBePaused refuses a running sandbox (E2B's v1 resume).
	MustBePaused bool
	// Reboot resumes a paused sandbox by booting it afresh from its files,
	// whatever its pause saved (E2B's memory false); nothing for a running
	// one.
	Reboot bool
}

// Endpoint is how the data plane reaches a running sandbox.
type Endpoint struct {
	// Transport reaches the sandbox's ports ("sandbox:<port>" URLs).
	Transport http.RoundTripper
	// Sandbox is a copy of its record (for access checks).
	Sandbox *Sandbox
	// Alive ends when the sandbox's current box goes away (killed, died,
	// rolled back), cutting requests in flight to it.
	Alive context.Context
}

// SnapshotUsage is the disk the snapshots use.
type SnapshotUsage struct {
	TotalBytes int64
	CapBytes   int64 // 0: no cap
	Count      int
	// Uploads counts the snapshots by upload state (none without a store).
	Uploads map[UploadState]int
}

// PoolStats is what a host keeps ready.
type PoolStats struct {
	Ready    map[string]int // ready sandboxes per template
	Shells   int            // prepared shells
	Standbys map[string]int // per snapshot: 1 when its standby is ready
}
