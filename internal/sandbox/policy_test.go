package sandbox

import (
	"net/netip"
	"reflect"
	"testing"
)

func TestParsePolicy(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	ok := []struct {
		name string
		in   Network
		want Policy
	}{
		{"default", DefaultNetwork, Policy{AllowInternet: true}},
		{"addresses and CIDRs", Network{AllowInternet: true, AllowOut: []string{"1.1.1.1", " 10.0.0.0/8"}, DenyOut: []string{"8.8.8.0/24"}},
			Policy{AllowInternet: true, AllowOut: pfx("1.1.1.1/32", "10.0.0.0/8"), DenyOut: pfx("8.8.8.0/24")}},
		{"ALL_TRAFFIC denied is the internet off", Network{AllowInternet: true, AllowOut: []string{"Example.COM.", "*.pypi.org"}, DenyOut: []string{"0.0.0.0/0"}},
			Policy{Domains: []string{"example.com", "*.pypi.org"}}},
		{"dnsServers open with domain rules", Network{AllowOut: []string{"a.example"}, DNSServers: []string{"1.1.1.1"}},
			Policy{AllowOut: pfx("1.1.1.1/32"), Domains: []string{"a.example"}}},
		{"dnsServers alone open nothing", Network{DNSServers: []string{"1.1.1.1"}}, Policy{}},
	}
	for _, c := range ok {
		got, err := ParsePolicy(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: policyOf = %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
	for _, bad := range []Network{
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
		if _, err := ParsePolicy(bad); err == nil {
			t.Errorf("ParsePolicy(%+v) accepted", bad)
		}
	}
}
