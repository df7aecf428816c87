package netns

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// Egress: each network gets an uplink, a veth pair from its router
// namespace to the host ("up0" <-> "cfu<slot>"), on its own /30 in
// 10.89.0.0/16. The router namespace forwards and masquerades the
// sandbox's traffic through it under the sandbox's policy (nftables table
// "cellfork" in the router namespace); the host masquerades it out of its
// own uplink. Whatever the policy, the sandbox cannot reach the host (its
// input chain drops new connections from uplinks), other sandboxes
// (uplink-to-uplink forwarding is dropped), link-local and metadata
// addresses, or the networks the host is attached to.

const (
	uplinkPrefix = "cfu"
	uplinkNet    = "10.89.0.0/16"
	tableName    = "cellfork"
	deniedName   = "denied"
)

// Policy is a sandbox's egress policy (sandbox.ParsePolicy makes one).
type Policy = sandbox.Policy

// allowsAddr says whether the policy lets a connection reach a, exactly as
// the router's nftables chains decide.
func allowsAddr(p *Policy, a netip.Addr, hostBlocked []netip.Prefix) bool {
	switch {
	case contains(alwaysBlocked, a) || contains(hostBlocked, a):
		return false
	case contains(p.AllowOut, a):
		return true
	case contains(p.DenyOut, a) || contains(privateRanges, a):
		return false
	}
	return p.AllowInternet
}

// allowsResolved says whether a connection for a name a domain rule allows
// may go to a, one of the name's addresses: an allowed name does not open
// the always-blocked, host or private networks (an address rule must allow
// those), and wins over a deny rule as address rules do.
func allowsResolved(p *Policy, a netip.Addr, hostBlocked []netip.Prefix) bool {
	switch {
	case contains(alwaysBlocked, a) || contains(hostBlocked, a):
		return false
	case contains(privateRanges, a):
		return contains(p.AllowOut, a)
	}
	return true
}

// allowsName says whether a domain rule allows name (lower case, no
// trailing dot).
func allowsName(p *Policy, name string) bool {
	for _, d := range p.Domains {
		if sub, ok := strings.CutPrefix(d, "*."); ok {
			if strings.HasSuffix(name, "."+sub) {
				return true
			}
		} else if name == d {
			return true
		}
	}
	return false
}

// resolves says whether the network's resolver answers for name: any name
// when the internet is open, else only names a domain rule allows (so a
// closed sandbox cannot tunnel data out through DNS).
func resolves(p *Policy, name string) bool { return p.AllowInternet || allowsName(p, name) }

func contains(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// alwaysBlocked are unreachable from every sandbox: the sandbox and uplink
// address spaces, loopback, link-local (metadata), multicast and reserved.
var alwaysBlocked = mustPrefixes("10.88.0.0/16", uplinkNet, "127.0.0.0/8", "0.0.0.0/8",
	"169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4")

// privateRanges are refused unless a policy allows them explicitly.
var privateRanges = mustPrefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "198.18.0.0/15")

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// slotAddrs returns the host-side and router-side addresses of a slot.
func slotAddrs(slot uint16) (host, router netip.Addr) {
	base := uint32(10)<<24 | uint32(89)<<16 | uint32(slot)<<2
	var h, r [4]byte
	binary.BigEndian.PutUint32(h[:], base|1)
	binary.BigEndian.PutUint32(r[:], base|2)
	return netip.AddrFrom4(h), netip.AddrFrom4(r)
}

// inNS runs f on a thread in the network namespace h.
func inNS(h netns.NsHandle, f func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := netns.Set(h); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := f()
	if err := netns.Set(orig); err != nil {
		return errors.Join(ferr, err) // the thread stays locked and dies with its goroutine
	}
	runtime.UnlockOSThread()
	return ferr
}

// attachUplink gives the network its uplink and policy table. It picks a
// free slot at random; a slot taken by another network (any daemon) fails
// with EEXIST and is retried.
func (n *Network) attachUplink(hostBlocked []netip.Prefix) error {
	hr, err := netlink.NewHandleAt(n.router)
	if err != nil {
		return err
	}
	defer hr.Close()
	var slot uint16
	for try := 0; ; try++ {
		var b [2]byte
		_, _ = rand.Read(b[:])
		slot = binary.BigEndian.Uint16(b[:])%16383 + 1
		veth := &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("%s%04x", uplinkPrefix, slot)},
			PeerName:  "up0", PeerNamespace: netlink.NsFd(int(n.router)),
		}
		err := netlink.LinkAdd(veth)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EEXIST) || try > 20 {
			return fmt.Errorf("adding uplink: %w", err)
		}
	}
	host, router := slotAddrs(slot)
	hostLink, err := netlink.LinkByName(fmt.Sprintf("%s%04x", uplinkPrefix, slot))
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(hostLink, addr30(host)); err != nil {
		return fmt.Errorf("addressing uplink: %w", err)
	}
	if err := netlink.LinkSetUp(hostLink); err != nil {
		return err
	}
	if err := up(hr, "up0", router.String()); err != nil {
		return err
	}
	up0, err := hr.LinkByName("up0")
	if err != nil {
		return err
	}
	if err := hr.RouteAdd(&netlink.Route{LinkIndex: up0.Attrs().Index, Gw: net.IP(host.AsSlice())}); err != nil {
		return fmt.Errorf("adding uplink route: %w", err)
	}
	if err := inNS(n.router, func() error {
		// ICMP errors answer denied non-TCP traffic; unthrottled, so every
		// attempt fails at once.
		return errors.Join(os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644),
			os.WriteFile("/proc/sys/net/ipv4/icmp_ratelimit", []byte("0"), 0o644))
	}); err != nil {
		return fmt.Errorf("enabling forwarding: %w", err)
	}
	return n.routerTable(hostBlocked)
}

func addr30(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(prefixLen, 32)}}
}

// uplinkName returns the host-side uplink interface of the network, or "".
func (n *Network) uplinkName() string {
	hr, err := netlink.NewHandleAt(n.router)
	if err != nil {
		return ""
	}
	defer hr.Close()
	l, err := hr.LinkByName("up0")
	if err != nil {
		return ""
	}
	peer, err := netlink.LinkByIndex(l.Attrs().ParentIndex)
	if err != nil {
		return ""
	}
	return peer.Attrs().Name
}
