package sandbox

import (
	"maps"
	"net"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Transform is what a network rule does to a matching request (E2B's
// SandboxNetworkTransform): set these headers, replacing any the sandbox
// sent under the same names.
type Transform struct {
	Headers map[string]string
}

// Limits on network rules, E2B's.
const (
	maxRuleDomains     = 10
	maxRuleDomainLen   = 128
	maxRuleHeaders     = 20
	maxHeaderNameLen   = 64
	maxHeaderValueLen  = 2048
	maxMaskRequestHost = 255
)

// RedactedValue stands for a rule's header value wherever the API reports
// a policy: the values are typically secrets and never leave the daemon.
// A value equal to it is refused, so that a policy read back and sent
// again cannot replace the secrets with the marker.
const RedactedValue = "[redacted]"

// MaskPortPlaceholder in Network.MaskRequestHost stands for the port a
// request is for (E2B's ${PORT}).
const MaskPortPlaceholder = "${PORT}"

// framingHeaders are the headers a rule may not set: they carry the
// request's framing or routing, not its meaning, and are the proxy's.
var framingHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Te": true, "Trailer": true, "Upgrade": true,
}

// parseTransforms validates network rules and returns the headers to set
// per domain rule (lower case, as Policy.Domains; header names canonical).
// Domains whose rule sets no header are left out: nothing to do there.
// Messages never quote a header value.
func parseTransforms(rules map[string]Transform) (map[string]map[string]string, error) {
	if len(rules) > maxRuleDomains {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "rules: at most %d domains, not %d", maxRuleDomains, len(rules))
	}
	keys := slices.Sorted(maps.Keys(rules))
	out := map[string]map[string]string{}
	seen := map[string]string{}
	for _, key := range keys {
		d, ok := domainRule(strings.TrimSpace(key))
		if _, err := netip.ParseAddr(d); err == nil {
			ok = false // rules match TLS server names, never addresses (as E2B)
		}
		if !ok || len(key) > maxRuleDomainLen {
			return nil, errdefs.New(errdefs.ErrInvalidArgument,
				"rules: %q is not a domain name (\"api.example.com\", or \"*.example.com\" for its subdomains; at most %d characters)", key, maxRuleDomainLen)
		}
		if other, dup := seen[d]; dup {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "rules: %q and %q are the same domain", other, key)
		}
		seen[d] = key
		h := rules[key].Headers
		if len(h) > maxRuleHeaders {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "rules: %q: at most %d headers, not %d", key, maxRuleHeaders, len(h))
		}
		set := map[string]string{}
		for _, name := range slices.Sorted(maps.Keys(h)) {
			value := h[name]
			canon := textproto.CanonicalMIMEHeaderKey(name)
			bad := func(why string) error {
				return errdefs.New(errdefs.ErrInvalidArgument, "rules: %q: header %q: %s", key, name, why)
			}
			switch {
			case name == "" || len(name) > maxHeaderNameLen || !httpguts.ValidHeaderFieldName(name):
				return nil, bad("not a header name (HTTP token characters, 1 to 64 of them)")
			case framingHeaders[canon]:
				return nil, bad("carries the request's framing or routing; a rule cannot set it")
			case hasKey(set, canon):
				return nil, bad("given twice (header names are case-insensitive)")
			case len(value) > maxHeaderValueLen || !httpguts.ValidHeaderFieldValue(value):
				return nil, bad("the value is not a valid header value (at most 2048 characters, no control characters)")
			case strings.Contains(value, "${e2b."):
				return nil, bad("${e2b.…} placeholders name E2B's secret store and workload identity, which cellfork has not; " +
					"put the value itself in the rule (it stays in the daemon, never in the sandbox)")
			case value == RedactedValue:
				return nil, bad("the value is the redaction marker the API reports in place of a value; send the value itself")
			}
			set[canon] = value
		}
		if len(set) > 0 {
			out[d] = set
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

// TransformFor returns the headers to set on a request to the server name
// (lower case, no trailing dot), or nil: the rule of the exact name wins,
// then the "*." rule of the longest suffix (a wildcard covers subdomains
// only, as in domain rules).
func (p *Policy) TransformFor(name string) map[string]string {
	if h, ok := p.Transforms[name]; ok {
		return h
	}
	var best map[string]string
	bestLen := -1
	for d, h := range p.Transforms {
		sub, ok := strings.CutPrefix(d, "*.")
		if ok && len(sub) > bestLen && strings.HasSuffix(name, "."+sub) {
			best, bestLen = h, len(sub)
		}
	}
	return best
}

// checkMask validates a MaskRequestHost: a host, optionally with a port,
// in ASCII, where ${PORT} may stand for the port a request is for.
func checkMask(mask string) error {
	if mask == "" {
		return nil
	}
	bad := errdefs.New(errdefs.ErrInvalidArgument,
		"maskRequestHost: %q is not a host[:port] in ASCII (\"${PORT}\" stands for the port, as in E2B: \"${PORT}-app.example.com\")", mask)
	s := strings.ReplaceAll(mask, MaskPortPlaceholder, "80")
	if len(mask) > maxMaskRequestHost || !httpguts.ValidHostHeader(s) {
		return bad
	}
	for i := range len(s) {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return bad
		}
	}
	host := s
	if h, port, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return bad
		}
		host = h
	} else if strings.Count(s, ":") > 0 && !strings.HasPrefix(s, "[") {
		return bad
	}
	if host == "" {
		return bad
	}
	return nil
}

// MaskedHost is the Host header a data-plane request to port carries into
// the sandbox under the mask ("" if there is none).
func (n *Network) MaskedHost(port int) string {
	return strings.ReplaceAll(n.MaskRequestHost, MaskPortPlaceholder, strconv.Itoa(port))
}

// cloneRules copies rules and their header maps.
func cloneRules(rules map[string]Transform) map[string]Transform {
	if rules == nil {
		return nil
	}
	out := make(map[string]Transform, len(rules))
	for d, t := range rules {
		out[d] = Transform{Headers: maps.Clone(t.Headers)}
	}
	return out
}
