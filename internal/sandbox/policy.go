package sandbox

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Policy is a sandbox's egress policy as the network enforces it: Network
// parsed (ParsePolicy). Always-blocked destinations stay blocked whatever it
// says. As in E2B, an allow rule wins over a deny rule.
type Policy struct {
	AllowInternet bool           // public destinations not denied below
	AllowOut      []netip.Prefix // allowed even if private or denied (never the always-blocked ones)
	DenyOut       []netip.Prefix // denied even if public
	// Domains are allowed names ("example.com", "*.example.com" for its
	// subdomains), enforced on HTTP (Host, port 80) and TLS (SNI, port 443)
	// by the network's proxy, which connects to what the name resolves to,
	// never to the address the sandbox asked for.
	Domains []string
	// Transforms are the headers to set on HTTPS requests, by domain rule
	// (as Domains; header names canonical): the proxy terminates TLS for
	// the server names they match (TransformFor) and sets them on every
	// request. They grant no access.
	Transforms map[string]map[string]string
}

// ParsePolicy validates a network policy (its ingress part too) and
// translates it for the network. Denying 0.0.0.0/0 is turning the internet off (E2B's
// ALL_TRAFFIC); allow rules win over deny rules.
func ParsePolicy(n Network) (Policy, error) {
	allow, domains, err := parseRules("allowOut", n.AllowOut)
	if err != nil {
		return Policy{}, err
	}
	deny, denyDomains, err := parseRules("denyOut", n.DenyOut)
	if err != nil {
		return Policy{}, err
	}
	if len(denyDomains) > 0 {
		return Policy{}, errdefs.New(errdefs.ErrInvalidArgument,
			"denyOut: %q: domain names can only be allowed (allowOut), as in E2B; deny addresses or CIDRs", denyDomains[0])
	}
	if len(n.DNSServers) > 10 {
		return Policy{}, errdefs.New(errdefs.ErrInvalidArgument, "dnsServers: at most 10 entries")
	}
	for _, s := range n.DNSServers {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || !a.Is4() {
			return Policy{}, errdefs.New(errdefs.ErrInvalidArgument, "dnsServers: %q is not an IPv4 address", s)
		}
		if len(domains) > 0 { // as in E2B, they only matter with domain rules
			allow = append(allow, netip.PrefixFrom(a, 32))
		}
	}
	transforms, err := parseTransforms(n.Rules)
	if err != nil {
		return Policy{}, err
	}
	if err := checkMask(n.MaskRequestHost); err != nil {
		return Policy{}, err
	}
	p := Policy{AllowInternet: n.AllowInternet, AllowOut: allow, Domains: domains, Transforms: transforms}
	for _, d := range deny {
		if d.Bits() == 0 {
			p.AllowInternet = false
		} else {
			p.DenyOut = append(p.DenyOut, d)
		}
	}
	return p, nil
}

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

// Clone copies a policy's slices.
func (n Network) Clone() Network {
	n.AllowOut, n.DenyOut, n.DNSServers = slices.Clone(n.AllowOut), slices.Clone(n.DenyOut), slices.Clone(n.DNSServers)
	n.Rules = cloneRules(n.Rules)
	return n
}
