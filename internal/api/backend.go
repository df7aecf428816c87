package api

import (
	"context"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// Backend is what the HTTP layer serves: every operation on sandboxes and
// snapshots, in domain terms. internal/manager implements it for one host.
// Implementations must be safe for concurrent use and return errdefs
// errors, which statusOf maps to HTTP statuses.
type Backend interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (*sandbox.Sandbox, error)
	Get(ctx context.Context, id string) (*sandbox.Sandbox, error)
	// List returns every sandbox, oldest first (by start time, then id).
	List(ctx context.Context) ([]*sandbox.Sandbox, error)
	Kill(ctx context.Context, id string) error
	SetTimeout(ctx context.Context, id string, d time.Duration) error
	ExtendTimeout(ctx context.Context, id string, d time.Duration) error
	// Connect resumes a paused sandbox (resumed true) or extends a running
	// one's life.
	Connect(ctx context.Context, id string, req sandbox.ConnectRequest) (sb *sandbox.Sandbox, resumed bool, err error)
	Pause(ctx context.Context, id string, req sandbox.PauseRequest) error
	// Metrics returns the samples between from and to (zero: the
	// sandbox's start, and now), oldest first.
	Metrics(ctx context.Context, id string, from, to time.Time) ([]sandbox.Metric, error)
	Network(ctx context.Context, id string) (sandbox.NetworkStatus, error)
	UpdateNetwork(ctx context.Context, id string, n sandbox.Network) error

	Snapshot(ctx context.Context, id, name string) (*sandbox.Snapshot, error)
	// ListSnapshots returns every snapshot, oldest first.
	ListSnapshots(ctx context.Context) ([]*sandbox.Snapshot, error)
	GetSnapshot(ctx context.Context, idOrName string) (*sandbox.Snapshot, error)
	DeleteSnapshot(ctx context.Context, idOrName string) error
	SnapshotUsage(ctx context.Context) (sandbox.SnapshotUsage, error)
	Fork(ctx context.Context, id string, n int, timeout time.Duration) ([]sandbox.ForkResult, error)
	Rollback(ctx context.Context, id, snapshot string) (*sandbox.Sandbox, error)
	Merge(ctx context.Context, parentID, childID string) (*sandbox.Sandbox, error)
	// Assume is a cluster's merge of a child here with its parent on
	// another host (a gateway's; manager.Assume).
	Assume(ctx context.Context, childID, parentID string) (*sandbox.Sandbox, error)

	// Endpoint is how the data plane reaches a running sandbox; a paused
	// one with autoResume is resumed first if wake says the request may
	// wake it.
	Endpoint(ctx context.Context, id string, wake func(*sandbox.Sandbox) bool) (sandbox.Endpoint, error)
	// PoolStats reports what is kept ready (for /health).
	PoolStats() sandbox.PoolStats
}
