// Package netns gives each sandbox its own network: two named network
// namespaces joined by a veth pair.
//
//	router ns "<name>-r"  cf0  10.88.0.1/30  <--veth-->  eth0 10.88.0.2/30  sandbox ns "<name>-s"
//
// gVisor (--network=sandbox) takes over every interface of the sandbox
// namespace, so the daemon cannot live there; it reaches the sandbox by
// opening sockets inside the router namespace (Dial). Every sandbox sees the
// same address, MAC and gateway, so a checkpoint restores into any other
// Network unchanged (fork, rollback). In the router namespace only the
// daemon's resolver (the sandbox's nameserver, 10.88.0.1:53) and its egress
// proxy listen; the router's only route out is its uplink, filtered by the
// sandbox's policy (egress.go), so from inside a sandbox the host, the
// daemon and every other sandbox are unreachable.
package netns

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// Addresses every sandbox sees.
const (
	SandboxIP = "10.88.0.2"
	GatewayIP = "10.88.0.1"
	prefixLen = 30
)

// The MACs on both ends of the sandbox link are fixed, so that a restored
// sandbox's neighbour cache is still right (no re-resolution on its first
// packets).
var (
	sandboxMAC = net.HardwareAddr{0x02, 0xcf, 0x00, 0x00, 0x00, 0x02}
	gatewayMAC = net.HardwareAddr{0x02, 0xcf, 0x00, 0x00, 0x00, 0x01}
)

// Dir is where named network namespaces are mounted (as iproute2 does).
const Dir = "/run/netns"

// Config is what all of a daemon's networks share.
type Config struct {
	// HostBlocked are the host's networks: no sandbox may reach them.
	HostBlocked []netip.Prefix
	// DNS are the upstream resolvers (host:port) the networks' resolvers
	// and proxies ask, from the daemon's own namespace.
	DNS []string
	// CA signs the certificates the egress proxy presents for hosts with
	// network rules (nil: policies with rules are refused).
	CA *CA
	// UpstreamRoots verify the hosts the proxy connects to for network
	// rules (nil: the host's roots).
	UpstreamRoots *x509.CertPool
}

// Network is one sandbox's pair of namespaces, with the resolver and the
// egress proxy the daemon runs in its router namespace. Safe for
// concurrent use.
type Network struct {
	name   string
	cfg    *Config
	router netns.NsHandle
	mu     sync.Mutex     // guards nft and policy
	nft    *nftables.Conn // lasting netlink connection into the router namespace
	policy Policy

	proxyDenied atomic.Uint64      // connections the proxy refused
	dnsRefused  atomic.Uint64      // queries the resolver refused (names no rule allows)
	stop        context.CancelFunc // ends the resolver, the proxy and their connections
}

// Name returns the base name (the namespaces are name-r and name-s).
func (n *Network) Name() string { return n.name }

// SandboxPath is the namespace path to put in the sandbox's OCI spec.
func (n *Network) SandboxPath() string { return filepath.Join(Dir, n.name+"-s") }

// Create makes the namespaces, the link between them and the uplink with
// its rules, and starts the network's resolver and proxy. Egress is refused
// until SetPolicy. On error nothing is left behind.
func Create(name string, cfg *Config) (_ *Network, err error) {
	if strings.ContainsAny(name, "/ ") || len(name) == 0 || len(name) > 60 {
		return nil, fmt.Errorf("invalid network name %q", name)
	}
	if cfg == nil {
		cfg = &Config{}
	}
	n := &Network{name: name, cfg: cfg, router: -1}
	defer func() {
		if err != nil {
			_ = n.Destroy()
		}
	}()
	r, err := newNamed(name + "-r")
	if err != nil {
		return nil, err
	}
	n.router = r
	s, err := newNamed(name + "-s")
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if err := configure(r, s); err != nil {
		return nil, fmt.Errorf("configuring network %s: %w", name, err)
	}
	if err := n.attachUplink(cfg.HostBlocked); err != nil {
		return nil, fmt.Errorf("attaching uplink to network %s: %w", name, err)
	}
	if err := n.serve(); err != nil {
		return nil, fmt.Errorf("starting the resolver of network %s: %w", name, err)
	}
	return n, nil
}

// Open returns the Network of existing namespaces (after a daemon restart)
// and starts its resolver and proxy; they follow the policy once SetPolicy
// states it again (the router's rules survived).
func Open(name string, cfg *Config) (*Network, error) {
	r, err := netns.GetFromPath(filepath.Join(Dir, name+"-r"))
	if err != nil {
		return nil, fmt.Errorf("opening network %s: %w", name, err)
	}
	if _, err := os.Stat(filepath.Join(Dir, name+"-s")); err != nil {
		r.Close()
		return nil, fmt.Errorf("opening network %s: %w", name, err)
	}
	if cfg == nil {
		cfg = &Config{}
	}
	n := &Network{name: name, cfg: cfg, router: r}
	if err := n.serve(); err != nil {
		n.Close()
		return nil, fmt.Errorf("starting the resolver of network %s: %w", name, err)
	}
	return n, nil
}

// newNamed creates a named namespace without moving the calling goroutine.
func newNamed(name string) (netns.NsHandle, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("getting current netns: %w", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if serr := netns.Set(orig); serr != nil {
		// The thread is in the wrong namespace: keep it locked so the Go
		// runtime discards it when this goroutine ends.
		return -1, errors.Join(err, fmt.Errorf("restoring netns: %w", serr))
	}
	runtime.UnlockOSThread()
	if err != nil {
		return -1, fmt.Errorf("creating netns %s: %w", name, err)
	}
	return h, nil
}

func configure(r, s netns.NsHandle) error {
	hr, err := netlink.NewHandleAt(r)
	if err != nil {
		return err
	}
	defer hr.Close()
	hs, err := netlink.NewHandleAt(s)
	if err != nil {
		return err
	}
	defer hs.Close()
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: "cf0", HardwareAddr: gatewayMAC},
		PeerName:         "eth0",
		PeerHardwareAddr: sandboxMAC,
		PeerNamespace:    netlink.NsFd(int(s)),
	}
	if err := hr.LinkAdd(veth); err != nil {
		return fmt.Errorf("adding veth: %w", err)
	}
	if err := up(hr, "cf0", GatewayIP); err != nil {
		return err
	}
	if err := up(hs, "eth0", SandboxIP); err != nil {
		return err
	}
	eth0, err := hs.LinkByName("eth0")
	if err != nil {
		return err
	}
	gw := &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP(GatewayIP)}
	if err := hs.RouteAdd(gw); err != nil {
		return fmt.Errorf("adding default route: %w", err)
	}
	return nil
}

// up brings lo and the named link up and gives the link addr/30.
func up(h *netlink.Handle, link, addr string) error {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("setting lo up: %w", err)
	}
	l, err := h.LinkByName(link)
	if err != nil {
		return err
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(addr), Mask: net.CIDRMask(prefixLen, 32)}}
	if err := h.AddrAdd(l, a); err != nil {
		return fmt.Errorf("adding %s to %s: %w", addr, link, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("setting %s up: %w", link, err)
	}
	return nil
}

// Dial opens a TCP connection to port inside the sandbox.
func (n *Network) Dial(ctx context.Context, port int) (net.Conn, error) {
	c, err := n.dialFromRouter(ctx, netip.AddrPortFrom(netip.MustParseAddr(SandboxIP), uint16(port)))
	if err != nil {
		return nil, err
	}
	return c, nil
}

// dialFromRouter opens a TCP connection from the router namespace: into
// the sandbox, or out through the uplink (as the sandbox's own traffic
// goes). The socket is created there; the connection then works from any
// thread.
func (n *Network) dialFromRouter(ctx context.Context, to netip.AddrPort) (*net.TCPConn, error) {
	var c net.Conn
	err := inNS(n.router, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp4", to.String())
		return err
	})
	if err != nil {
		if c != nil {
			c.Close()
		}
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// Close stops the Network's resolver and proxy and releases its handles
// without touching the namespaces.
func (n *Network) Close() {
	if n.stop != nil {
		n.stop()
	}
	n.mu.Lock()
	if n.nft != nil {
		_ = n.nft.CloseLasting()
		n.nft = nil
	}
	n.mu.Unlock()
	if n.router >= 0 {
		n.router.Close()
		n.router = -1
	}
}

// Destroy removes both namespaces (and with them the veth pair). Removing a
// namespace that is already gone is not an error.
func (n *Network) Destroy() error {
	n.Close()
	return Remove(n.name)
}

// Remove deletes the namespaces of the named network, if they exist.
func Remove(name string) error {
	var errs []error
	for _, suffix := range []string{"-r", "-s"} {
		if err := netns.DeleteNamed(name + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			if _, serr := os.Stat(filepath.Join(Dir, name+suffix)); serr == nil {
				errs = append(errs, fmt.Errorf("removing netns %s%s: %w", name, suffix, err))
			}
		}
	}
	return errors.Join(errs...)
}

// List returns the names of the networks whose namespaces start with prefix.
func List(prefix string) ([]string, error) {
	entries, err := os.ReadDir(Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var names []string
	for _, e := range entries {
		base, ok := strings.CutSuffix(e.Name(), "-r")
		if !ok {
			base, ok = strings.CutSuffix(e.Name(), "-s")
		}
		if ok && strings.HasPrefix(base, prefix) && !seen[base] {
			seen[base] = true
			names = append(names, base)
		}
	}
	return names, nil
}

// Host makes the sandbox networks of one daemon: sandbox.Networks over
// Create, Open, Remove and List. Safe for concurrent use.
type Host struct {
	cfg *Config
}

var _ sandbox.Networks = (*Host)(nil)

// NewHost returns the networks of a daemon whose host side SetupHost made.
func NewHost(cfg Config) *Host { return &Host{cfg: &cfg} }

// Create makes a new network.
func (h *Host) Create(name string) (sandbox.Net, error) {
	n, err := Create(name, h.cfg)
	if err != nil {
		return nil, err // not a nil *Network in a non-nil interface
	}
	return n, nil
}

// Open takes over an existing network.
func (h *Host) Open(name string) (sandbox.Net, error) {
	n, err := Open(name, h.cfg)
	if err != nil {
		return nil, err
	}
	return n, nil
}

// Remove deletes a network by name.
func (h *Host) Remove(name string) error { return Remove(name) }

// List returns the names of the networks starting with prefix.
func (h *Host) List(prefix string) ([]string, error) { return List(prefix) }
