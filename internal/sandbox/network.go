package sandbox

import (
	"context"
	"net"
)

// Net is one box's network: the namespace its runtime joins, the way in
// to its ports, and its egress policy. Implementations (netns) must be safe
// for concurrent use.
type Net interface {
	// SandboxPath is the network namespace to put in the runtime spec.
	SandboxPath() string
	// Dial connects to a port inside the box.
	Dial(ctx context.Context, port int) (net.Conn, error)
	// SetPolicy replaces the egress policy (a fresh network refuses all
	// egress until it gets one).
	SetPolicy(Policy) error
	// Denied counts the connection attempts the policy refused.
	Denied() (uint64, error)
	// Close stops the daemon's services for it (resolver, proxy) and keeps
	// the network: a daemon that exits leaves its sandboxes running.
	Close()
	// Destroy removes the network.
	Destroy() error
}

// Networks makes and finds boxes' networks by name. Implementations must be
// safe for concurrent use.
type Networks interface {
	Create(name string) (Net, error)
	// Open takes over an existing network (a sandbox adopted after a
	// daemon restart).
	Open(name string) (Net, error)
	// Remove deletes a network that has no Net value (reconcile).
	Remove(name string) error
	// List returns the names of the networks starting with prefix.
	List(prefix string) ([]string, error)
}
