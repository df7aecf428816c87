package manager

import (
	"context"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/netns"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// parseRules splits allowOut/denyOut entries into prefixes (IPv4
// addresses or CIDRs) and domain names ("example.com", "*.example.com").
func parseRules(field string, rules []string) ([]netip.Prefix, []string, error) {
	if len(rules) > 256 {
		return nil, nil, errdefs.New(errdefs.ErrInvalidArgument, "%s: at most 256 entries", field)
	}
	var prefixes []netip.Prefix
	var domains []string
	for _, r := range rules {
		r = strings.TrimSpace(r)
		if p, err := netip.ParsePrefix(r); err == nil && p.Addr().Is4() {
			prefixes = append(prefixes, p.Masked())
			continue
		}
		if a, err := netip.ParseAddr(r); err == nil && a.Is4() {
			prefixes = append(prefixes, netip.PrefixFrom(a, 32))
			continue
		}
		if strings.Contains(r, ":") {
			return nil, nil, errdefs.New(errdefs.ErrInvalidArgument, "%s: %q: sandboxes have no IPv6; give IPv4 addresses, CIDRs or domain names", field, r)
		}
		d, ok := domainRule(r)
		if !ok {
			return nil, nil, errdefs.New(errdefs.ErrInvalidArgument, "%s: %q is not an IPv4 address, a CIDR or a domain name (\"example.com\", \"*.example.com\")", field, r)
		}
		domains = append(domains, d)
	}
	return prefixes, domains, nil
}

// domainRule normalises a domain name, optionally "*." and a name for its
// subdomains.
func domainRule(s string) (string, bool) {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	name := strings.TrimPrefix(s, "*.")
	if len(name) == 0 || len(name) > 253 {
		return "", false
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "", false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", false
			}
		}
	}
	return s, true
}

// policyOf validates a network policy and translates it for netns. Denying
// 0.0.0.0/0 is turning the internet off (E2B's ALL_TRAFFIC); allow rules
// win over deny rules.
func policyOf(n sandbox.Network) (netns.Policy, error) {
	allow, domains, err := parseRules("allowOut", n.AllowOut)
	if err != nil {
		return netns.Policy{}, err
	}
	deny, denyDomains, err := parseRules("denyOut", n.DenyOut)
	if err != nil {
		return netns.Policy{}, err
	}
	if len(denyDomains) > 0 {
		return netns.Policy{}, errdefs.New(errdefs.ErrInvalidArgument,
			"denyOut: %q: domain names can only be allowed (allowOut), as in E2B; deny addresses or CIDRs", denyDomains[0])
	}
	if len(n.DNSServers) > 10 {
		return netns.Policy{}, errdefs.New(errdefs.ErrInvalidArgument, "dnsServers: at most 10 entries")
	}
	for _, s := range n.DNSServers {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || !a.Is4() {
			return netns.Policy{}, errdefs.New(errdefs.ErrInvalidArgument, "dnsServers: %q is not an IPv4 address", s)
		}
		if len(domains) > 0 { // as in E2B, they only matter with domain rules
			allow = append(allow, netip.PrefixFrom(a, 32))
		}
	}
	p := netns.Policy{AllowInternet: n.AllowInternet, AllowOut: allow, Domains: domains}
	for _, d := range deny {
		if d.Bits() == 0 {
			p.AllowInternet = false
		} else {
			p.DenyOut = append(p.DenyOut, d)
		}
	}
	return p, nil
}

// applyPolicy installs the sandbox's network policy on a box, unless it is
// there already (pooled boxes carry the default one).
func (m *Manager) applyPolicy(b *box, n sandbox.Network) error {
	if b.policy != nil && reflect.DeepEqual(*b.policy, n) {
		return nil
	}
	p, err := policyOf(n)
	if err != nil {
		return err
	}
	if err := b.net.SetPolicy(p); err != nil {
		return err
	}
	c := cloneNetwork(n)
	b.policy = &c
	return nil
}

// NetworkStatus is a sandbox's policy and how many connection attempts it
// has refused.
type NetworkStatus struct {
	Policy sandbox.Network
	Denied uint64
}

// Network returns the sandbox's policy and its denied-connection count.
func (m *Manager) Network(ctx context.Context, id string) (NetworkStatus, error) {
	l, err := m.locked(id)
	if err != nil {
		return NetworkStatus{}, err
	}
	defer l.mu.Unlock()
	st := NetworkStatus{Policy: l.rec.Network}
	if l.box != nil {
		st.Denied, _ = l.box.net.Denied()
	}
	return st, nil
}

// UpdateNetwork replaces the sandbox's network policy, at once if it runs
// (or is frozen), else when it resumes.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, n sandbox.Network) error {
	if _, err := policyOf(n); err != nil {
		return err
	}
	l, err := m.locked(id)
	if err != nil {
		return err
	}
	defer l.mu.Unlock()
	if l.box != nil {
		if err := m.applyPolicy(l.box, n); err != nil {
			return err
		}
	}
	old := l.rec.Network
	l.rec.Network = n
	if err := m.st.Put(ctx, l.rec); err != nil {
		l.rec.Network = old
		if l.box != nil {
			_ = m.applyPolicy(l.box, old)
		}
		return err
	}
	return nil
}

// cloneNetwork copies a policy's slices.
func cloneNetwork(n sandbox.Network) sandbox.Network {
	n.AllowOut, n.DenyOut, n.DNSServers = slices.Clone(n.AllowOut), slices.Clone(n.DenyOut), slices.Clone(n.DNSServers)
	return n
}
