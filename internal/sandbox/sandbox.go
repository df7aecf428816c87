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
	AccessToken string // envd access token (X-Access-Token)
	OnTimeout   string // "kill"
}

// Limits are the resources given to one sandbox.
type Limits struct {
	CPUCount int
	MemoryMB int
	PidsMax  int
}

// Spec is what the runtime needs to start a sandbox.
type Spec struct {
	RuntimeID string
	BundleDir string   // per-sandbox directory for the OCI bundle and logs
	Rootfs    string   // read-only lower layer; writes stay in sandbox memory
	Args      []string // init process (the agent)
	Env       []string
	NetnsPath string
	Limits    Limits
}

// Stats is one resource-usage sample.
type Stats struct {
	CPUUsage    time.Duration // cumulative CPU time
	MemoryBytes uint64
	MemoryCache uint64
}

// Runtime starts and stops isolated sandboxes. Implementations must be safe
// for concurrent use.
type Runtime interface {
	// Start boots a sandbox and returns once its init process runs.
	Start(ctx context.Context, s Spec) error
	// Destroy kills the sandbox and frees everything the runtime holds for
	// it. Destroying a sandbox that does not exist is not an error.
	Destroy(ctx context.Context, runtimeID string) error
	// Running reports whether the sandbox exists and runs.
	Running(ctx context.Context, runtimeID string) (bool, error)
	// List returns the runtime ids of every sandbox the runtime knows.
	List(ctx context.Context) ([]string, error)
	// Stats samples resource usage.
	Stats(ctx context.Context, runtimeID string) (Stats, error)
}

// Store persists sandbox records. Implementations must be safe for
// concurrent use; Put is atomic.
type Store interface {
	Put(ctx context.Context, s *Sandbox) error
	Get(ctx context.Context, id string) (*Sandbox, error) // errdefs.ErrNotFound if absent
	List(ctx context.Context) ([]*Sandbox, error)
	Delete(ctx context.Context, id string) error
}
