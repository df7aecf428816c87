package manager

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/cellfork/cellfork/internal/netns"
	"github.com/cellfork/cellfork/internal/sandbox"
)

func TestPolicyOf(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	ok := []struct {
		name string
		in   sandbox.Network
		want netns.Policy
	}{
		{"default", sandbox.DefaultNetwork, netns.Policy{AllowInternet: true}},
		{"addresses and CIDRs", sandbox.Network{AllowInternet: true, AllowOut: []string{"1.1.1.1", " 10.0.0.0/8"}, DenyOut: []string{"8.8.8.0/24"}},
			netns.Policy{AllowInternet: true, AllowOut: pfx("1.1.1.1/32", "10.0.0.0/8"), DenyOut: pfx("8.8.8.0/24")}},
		{"ALL_TRAFFIC denied is the internet off", sandbox.Network{AllowInternet: true, AllowOut: []string{"Example.COM.", "*.pypi.org"}, DenyOut: []string{"0.0.0.0/0"}},
			netns.Policy{Domains: []string{"example.com", "*.pypi.org"}}},
		{"dnsServers open with domain rules", sandbox.Network{AllowOut: []string{"a.example"}, DNSServers: []string{"1.1.1.1"}},
			netns.Policy{AllowOut: pfx("1.1.1.1/32"), Domains: []string{"a.example"}}},
		{"dnsServers alone open nothing", sandbox.Network{DNSServers: []string{"1.1.1.1"}}, netns.Policy{}},
	}
	for _, c := range ok {
		got, err := policyOf(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: policyOf = %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
	for _, bad := range []sandbox.Network{
		{DenyOut: []string{"example.com"}},
		{AllowOut: []string{"*.*"}},
		{AllowOut: []string{"-a.example"}},
		{AllowOut: []string{"a..example"}},
		{AllowOut: []string{"exa mple.com"}},
		{AllowOut: []string{"::1"}},
		{AllowOut: []string{"2001:db8::/32"}},
		{AllowOut: []string{""}},
		{DNSServers: []string{"dns.google"}},
		{DNSServers: make([]string, 11)},
	} {
		if _, err := policyOf(bad); err == nil {
			t.Errorf("policyOf(%+v) accepted", bad)
		}
	}
}
