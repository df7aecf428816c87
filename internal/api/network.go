package api

import (
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/cellfork/cellfork/internal/api/apitypes"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// networkPolicy turns E2B's create-time `network` object (nil: E2B's
// default) and its allow_internet_access into our policy. Options we do not
// implement are refused, not ignored.
func networkPolicy(b *apitypes.NetworkConfig, allowInternet *bool) (sandbox.Network, error) {
	n := sandbox.DefaultNetwork
	if allowInternet != nil {
		n.AllowInternet = *allowInternet
	}
	if b == nil {
		return n, nil
	}
	switch {
	case b.EgressProxy != nil:
		return n, errdefs.New(errdefs.ErrInvalidArgument, "network.egressProxy is not supported")
	case len(b.HTTPSPorts) > 0:
		return n, errdefs.New(errdefs.ErrInvalidArgument, "network.httpsPorts is not supported")
	}
	if b.AllowPublicTraffic != nil {
		n.AllowPublicTraffic = *b.AllowPublicTraffic
	}
	if b.MaskRequestHost != nil {
		n.MaskRequestHost = *b.MaskRequestHost
	}
	n.AllowOut, n.DenyOut, n.DNSServers = b.AllowOut, b.DenyOut, b.DNSServers
	if b.Rules != nil {
		n.Rules = make(map[string]sandbox.Transform, len(b.Rules))
		for _, domain := range slices.Sorted(maps.Keys(b.Rules)) {
			rules := b.Rules[domain]
			if len(rules) > 1 {
				return n, errdefs.New(errdefs.ErrInvalidArgument, "network.rules: %q: at most 1 rule per domain, as in E2B", domain)
			}
			var t sandbox.Transform
			if len(rules) == 1 && rules[0].Transform != nil {
				t.Headers = rules[0].Transform.Headers
			}
			// Keys are stored (and reported) in lower case, as E2B
			// normalizes them on write.
			key := strings.ToLower(strings.TrimSpace(domain))
			if _, dup := n.Rules[key]; dup {
				return n, errdefs.New(errdefs.ErrInvalidArgument, "network.rules: %q: given twice (domains are case-insensitive)", domain)
			}
			n.Rules[key] = t
		}
	}
	return n, nil
}

// networkJSON is the policy as reported (E2B's `network` in SandboxDetail).
// Rules are reported with their domains and header names; every value is
// sandbox.RedactedValue (they are secrets, the daemon's alone).
func networkJSON(n sandbox.Network) apitypes.NetworkOut {
	out := apitypes.NetworkOut{AllowPublicTraffic: n.AllowPublicTraffic, AllowOut: n.AllowOut, DenyOut: n.DenyOut, DNSServers: n.DNSServers}
	if n.MaskRequestHost != "" {
		out.MaskRequestHost = &n.MaskRequestHost
	}
	if len(n.Rules) > 0 {
		out.Rules = make(map[string][]apitypes.NetworkRule, len(n.Rules))
		for d, t := range n.Rules {
			out.Rules[d] = []apitypes.NetworkRule{}
			if len(t.Headers) > 0 {
				h := make(map[string]string, len(t.Headers))
				for name := range t.Headers {
					h[name] = sandbox.RedactedValue
				}
				out.Rules[d] = []apitypes.NetworkRule{{Transform: &apitypes.NetworkTransform{Headers: h}}}
			}
		}
	}
	if out.AllowOut == nil {
		out.AllowOut = []string{}
	}
	if out.DenyOut == nil {
		out.DenyOut = []string{}
	}
	return out
}

// updateNetwork is E2B's PUT /sandboxes/{id}/network: the body replaces the
// policy, rules included (omitted fields mean cleared; internet access
// defaults to on). Ingress (allowPublicTraffic, maskRequestHost) is set at
// create and kept. The body is
// required: a request that lost it must not open the sandbox's egress.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var b apitypes.NetworkConfig
	if err := decodeRequired(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	cur, err := s.m.Network(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// Ingress is set at create and kept, as in E2B (whose update has no
	// field for it); a malformed one is still refused.
	if b.MaskRequestHost != nil {
		if _, err := sandbox.ParsePolicy(sandbox.Network{MaskRequestHost: *b.MaskRequestHost}); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	b.AllowPublicTraffic, b.MaskRequestHost = &cur.Policy.AllowPublicTraffic, &cur.Policy.MaskRequestHost
	n, err := networkPolicy(&b, b.AllowInternetAccess)
	if err == nil {
		err = s.m.UpdateNetwork(r.Context(), id, n)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// getNetwork (ours) reports the policy and how many connection attempts it
// refused.
func (s *Server) getNetwork(w http.ResponseWriter, r *http.Request) {
	st, err := s.m.Network(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, apitypes.NetworkStatus{AllowInternetAccess: st.Policy.AllowInternet,
		Network: networkJSON(st.Policy), DeniedConnections: int(st.Denied)})
}
