package netns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Expression builders for the few rule shapes we use.

func ifname(name string) []byte {
	b := make([]byte, 16)
	copy(b, name)
	return b
}

// iif / oif match an interface name; a name ending in '*' matches the prefix.
func ifMatch(key expr.MetaKey, name string, eq bool) []expr.Any {
	data := ifname(name)
	if name[len(name)-1] == '*' {
		data = []byte(name[:len(name)-1])
	}
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: data}}
}

func iif(name string) []expr.Any          { return ifMatch(expr.MetaKeyIIFNAME, name, true) }
func oif(name string) []expr.Any          { return ifMatch(expr.MetaKeyOIFNAME, name, true) }
func oifNot(name string) []expr.Any       { return ifMatch(expr.MetaKeyOIFNAME, name, false) }
func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

// established matches ct state established,related.
func established() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// ipv4 matches IPv4 packets (the tables are inet).
func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// inPrefix matches an IPv4 source (offset 12) or destination (16) in p.
func inPrefix(offset uint32, p netip.Prefix) []expr.Any {
	m := make([]byte, 4)
	binary.BigEndian.PutUint32(m, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		m = make([]byte, 4)
	}
	netb := p.Masked().Addr().As4()
	return append(ipv4(),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: netb[:]},
	)
}

func daddrIn(p netip.Prefix) []expr.Any { return inPrefix(16, p) }
func saddrIn(p netip.Prefix) []expr.Any { return inPrefix(12, p) }

// l4 matches the transport protocol; dport, the transport destination port.
func l4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

// redirect sends the packet to port on the router itself (DNAT to the
// address it arrived on).
func redirect(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

// countDenied bumps the table's "denied" counter.
func countDenied() expr.Any { return &expr.Objref{Type: 1 /* NFT_OBJECT_COUNTER */, Name: deniedName} }

// refuse adds rules that answer a denied packet matching match at once, so
// sandboxed code fails fast instead of waiting on a timeout: a TCP reset
// (never rate-limited, unlike ICMP) for TCP, ICMP administratively
// prohibited for the rest. count records the attempt.
func refuse(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain, count bool, match ...[]expr.Any) {
	var m []expr.Any
	for _, e := range match {
		m = append(m, e...)
	}
	var counter []expr.Any
	if count {
		counter = one(countDenied())
	}
	rule(c, t, ch, m, l4(unix.IPPROTO_TCP), counter, one(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}))
	rule(c, t, ch, m, counter, one(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}))
}

func rule(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain, exprs ...[]expr.Any) {
	var all []expr.Any
	for _, e := range exprs {
		all = append(all, e...)
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: all})
}

func one(e expr.Any) []expr.Any { return []expr.Any{e} }

// conn returns the network's lasting nftables connection (opening a
// netlink socket inside a namespace costs milliseconds). Caller holds n.mu.
func (n *Network) conn() (*nftables.Conn, error) {
	if n.nft == nil {
		c, err := nftables.New(nftables.WithNetNSFd(int(n.router)), nftables.AsLasting())
		if err != nil {
			return nil, err
		}
		n.nft = c
	}
	return n.nft, nil
}

// routerTable installs the router namespace's table: forwarding only from
// the sandbox out to the uplink, first past the always-refused
// destinations (static, installed once here), then through the "policy"
// chain (SetPolicy rewrites it and "proxy"; a fresh network refuses
// everything); nothing new to the router itself but its resolver and
// proxy ports; masquerade out of the uplink.
func (n *Network) routerTable(hostBlocked []netip.Prefix) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	c, err := n.conn()
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: tableName})
	c.AddObj(&nftables.CounterObj{Table: t, Name: deniedName})
	egress := c.AddChain(&nftables.Chain{Name: "egress", Table: t})
	policy := c.AddChain(&nftables.Chain{Name: "policy", Table: t})
	drop := nftables.ChainPolicyDrop
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	rule(c, t, fwd, established(), one(verdict(expr.VerdictAccept)))
	rule(c, t, fwd, iif("cf0"), oif("up0"), one(&expr.Verdict{Kind: expr.VerdictJump, Chain: "egress"}))
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	rule(c, t, in, established(), one(verdict(expr.VerdictAccept)))
	gw := daddrIn(netip.PrefixFrom(netip.MustParseAddr(GatewayIP), 32))
	rule(c, t, in, iif("cf0"), gw, l4(unix.IPPROTO_UDP), dport(53), one(verdict(expr.VerdictAccept)))
	for _, port := range []uint16{53, httpProxyPort, tlsProxyPort} {
		rule(c, t, in, iif("cf0"), gw, l4(unix.IPPROTO_TCP), dport(port), one(verdict(expr.VerdictAccept)))
	}
	refuse(c, t, in, true, iif("cf0"))
	rule(c, t, in, iif("up0"), one(verdict(expr.VerdictDrop)))
	c.AddChain(&nftables.Chain{Name: "proxy", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	rule(c, t, post, oif("up0"), one(&expr.Masq{}))
	for _, pr := range append(append([]netip.Prefix{}, alwaysBlocked...), hostBlocked...) {
		refuse(c, t, egress, true, daddrIn(pr))
	}
	rule(c, t, egress, one(&expr.Verdict{Kind: expr.VerdictJump, Chain: "policy"}))
	refuse(c, t, policy, true)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing router rules: %w", err)
	}
	return nil
}

// SetPolicy replaces the network's egress policy, atomically. The
// always-refused destinations stay refused whatever it says. With domain
// rules, HTTP and TLS to destinations no address rule allows go through the
// network's proxy, which decides by Host and SNI; with network rules, so
// does TLS to port 443 (the proxy applies the rules).
func (n *Network) SetPolicy(p Policy) error {
	if len(p.Transforms) > 0 && n.cfg.CA == nil {
		return errors.New("network rules need the daemon's egress CA (netns.Config.CA)")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	c, err := n.conn()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: tableName}
	egress := &nftables.Chain{Name: "policy", Table: t}
	c.FlushChain(egress)
	for _, pr := range p.AllowOut {
		rule(c, t, egress, daddrIn(pr), one(verdict(expr.VerdictAccept)))
	}
	for _, pr := range append(slices.Clone(p.DenyOut), privateRanges...) {
		refuse(c, t, egress, true, daddrIn(pr))
	}
	if p.AllowInternet {
		rule(c, t, egress, ipv4(), one(verdict(expr.VerdictAccept)))
	}
	refuse(c, t, egress, true)

	proxy := &nftables.Chain{Name: "proxy", Table: t}
	c.FlushChain(proxy)
	redir := func(from, to uint16) {
		rule(c, t, proxy, iif("cf0"), ipv4(), l4(unix.IPPROTO_TCP), dport(from), redirect(to))
	}
	if len(p.Transforms) > 0 {
		// Network rules are by server name, whatever the address.
		redir(443, tlsProxyPort)
	}
	if len(p.Domains) > 0 {
		for _, pr := range p.AllowOut {
			rule(c, t, proxy, daddrIn(pr), one(verdict(expr.VerdictReturn)))
		}
		redir(80, httpProxyPort)
		if len(p.Transforms) == 0 {
			redir(443, tlsProxyPort)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("setting egress policy: %w", err)
	}
	n.policy = p
	return nil
}

// currentPolicy is the policy SetPolicy last installed.
func (n *Network) currentPolicy() Policy {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.policy
}

// Denied returns how many connection attempts the sandbox's policy has
// refused: packets of new connections the router dropped, and connections
// its proxy turned away.
func (n *Network) Denied() (uint64, error) {
	fw, proxy, _, err := n.DeniedByReason()
	return fw + proxy, err
}

// DeniedByReason splits the refusals by where they happened: the router's
// rules (firewall), the domain-rule proxy, and the resolver (names no rule
// allows; not counted by Denied, as no connection was attempted).
func (n *Network) DeniedByReason() (firewall, proxy, dns uint64, err error) {
	proxy, dns = n.proxyDenied.Load(), n.dnsRefused.Load()
	n.mu.Lock()
	defer n.mu.Unlock()
	c, err := n.conn()
	if err != nil {
		return 0, proxy, dns, err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: tableName}
	objs, err := c.GetObjects(t)
	if err != nil {
		return 0, proxy, dns, err
	}
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok && co.Name == deniedName {
			return co.Packets, proxy, dns, nil
		}
	}
	return 0, proxy, dns, nil
}

// SetupHost prepares the host once per daemon start: IPv4 forwarding on,
// and a "cellfork" table that keeps uplinks from reaching the host itself,
// each other or the host's networks (blocked), and masquerades their
// traffic out of the host's own uplink. It replaces an existing table.
func SetupHost(blocked []netip.Prefix) error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enabling IPv4 forwarding: %w", err)
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: tableName}
	if tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet); err == nil {
		for _, x := range tables {
			if x.Name == tableName {
				c.DelTable(t)
			}
		}
	}
	t = c.AddTable(t)
	accept := nftables.ChainPolicyAccept
	prio := nftables.ChainPriorityRef(-10)
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: prio, Policy: &accept})
	rule(c, t, in, iif(uplinkPrefix+"*"), established(), one(verdict(expr.VerdictAccept)))
	refuse(c, t, in, false, iif(uplinkPrefix+"*"))
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: prio, Policy: &accept})
	refuse(c, t, fwd, false, iif(uplinkPrefix+"*"), oif(uplinkPrefix+"*"))
	for _, p := range append(append([]netip.Prefix{}, alwaysBlocked...), blocked...) {
		refuse(c, t, fwd, false, iif(uplinkPrefix+"*"), daddrIn(p))
	}
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	rule(c, t, post, saddrIn(netip.MustParsePrefix(uplinkNet)), oifNot(uplinkPrefix+"*"), one(&expr.Masq{}))
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing host rules: %w", err)
	}
	return nil
}

// HostNetworks returns the networks the host's interfaces are on (except
// loopback and uplinks): destinations no sandbox may reach.
func HostNetworks() ([]netip.Prefix, error) {
	links, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, l := range links {
		if l.Flags&net.FlagLoopback != 0 || strings.HasPrefix(l.Name, uplinkPrefix) {
			continue
		}
		addrs, _ := l.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				if p, err := netip.ParsePrefix(ipn.String()); err == nil {
					out = append(out, p.Masked())
				}
			}
		}
	}
	return out, nil
}
