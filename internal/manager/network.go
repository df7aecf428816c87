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

// parseRules turns allowOut/denyOut entries (IPv4 addresses or CIDRs) into
// prefixes. Domain rules are refused until the egress proxy exists.
func parseRules(field string, rules []string) ([]netip.Prefix, error) {
	if len(rules) > 256 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "%s: at most 256 entries", field)
	}
	out := make([]netip.Prefix, 0, len(rules))
	for _, r := range rules {
		r = strings.TrimSpace(r)
		if p, err := netip.ParsePrefix(r); err == nil && p.Addr().Is4() {
			out = append(out, p.Masked())
			continue
		}
		if a, err := netip.ParseAddr(r); err == nil && a.Is4() {
			out = append(out, netip.PrefixFrom(a, 32))
			continue
		}
		if strings.Contains(r, ":") {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "%s: %q: sandboxes have no IPv6; give IPv4 addresses or CIDRs", field, r)
		}
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "%s: %q: domain rules are not supported yet; give IPv4 addresses or CIDRs", field, r)
	}
	return out, nil
}

// policyOf validates a network policy and translates it for netns.
func policyOf(n sandbox.Network) (netns.Policy, error) {
	allow, err := parseRules("allowOut", n.AllowOut)
	if err != nil {
		return netns.Policy{}, err
	}
	deny, err := parseRules("denyOut", n.DenyOut)
	if err != nil {
		return netns.Policy{}, err
	}
	return netns.Policy{AllowInternet: n.AllowInternet, AllowOut: allow, DenyOut: deny}, nil
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
	n.AllowOut, n.DenyOut = slices.Clone(n.AllowOut), slices.Clone(n.DenyOut)
	return n
}
