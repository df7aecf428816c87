package netns

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/cellfork/cellfork/internal/netns/netnstest"
)

// fromSandbox runs f on a thread in the sandbox namespace (a host socket
// there stands in for the sandbox's traffic).
func fromSandbox(t *testing.T, n *Network, f func() error) error {
	t.Helper()
	s, err := netns.GetFromPath(n.SandboxPath())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return inNS(s, f)
}

// fetch sends one HTTP request for host to ip:80, or over TLS with the
// server name host to ip:443, from the sandbox and returns the answer.
func fetch(t *testing.T, n *Network, ip, host string, overTLS bool) (string, error) {
	t.Helper()
	var c net.Conn
	port := "80"
	if overTLS {
		port = "443"
	}
	err := fromSandbox(t, n, func() error {
		var err error
		c, err = net.DialTimeout("tcp4", net.JoinHostPort(ip, port), 2*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if overTLS {
		tc := tls.Client(c, &tls.Config{ServerName: host, InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			return "", err
		}
		c = tc
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
	b, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	_, body, ok := strings.Cut(string(b), "\r\n\r\n")
	if !ok {
		return "", fmt.Errorf("no HTTP answer: %q", b)
	}
	return body, nil
}

// resolve asks the sandbox's nameserver (the gateway) for name's address.
func resolve(t *testing.T, n *Network, name string) (string, error) {
	t.Helper()
	var r *dns.Msg
	err := fromSandbox(t, n, func() error {
		var err error
		r, err = dns.Exchange(new(dns.Msg).SetQuestion(dns.Fqdn(name), dns.TypeA), GatewayIP+":53")
		return err
	})
	if err != nil {
		return "", err
	}
	if r.Rcode != dns.RcodeSuccess {
		return dns.RcodeToString[r.Rcode], nil
	}
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			return a.A.String(), nil
		}
	}
	return "no answer", nil
}

func TestDomainRules(t *testing.T) {
	blocked, err := HostNetworks()
	if err != nil {
		t.Fatal(err)
	}
	upstream, stop, err := netnstest.ServeDNS()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	n := testNetwork(t, "cftest-domain", &Config{HostBlocked: blocked, DNS: []string{upstream}})
	allowed, other := "203.0.113.10", netnstest.OtherIP

	// Internet off, one domain allowed.
	if err := n.SetPolicy(Policy{Domains: []string{"allowed.test", "*.allowed.test"}}); err != nil {
		t.Fatal(err)
	}
	for _, overTLS := range []bool{false, true} {
		proto := map[bool]string{false: "HTTP", true: "TLS"}[overTLS]
		t.Run(proto, func(t *testing.T) {
			if got, err := fetch(t, n, allowed, "allowed.test", overTLS); err != nil || got != "allowed.test at "+allowed {
				t.Errorf("allowed name: %q, %v", got, err)
			}
			if got, err := fetch(t, n, allowed, "www.allowed.test", overTLS); err != nil || got != "www.allowed.test at "+allowed {
				t.Errorf("wildcard: %q, %v", got, err)
			}
			// An allowed name sent to another address reaches the name's
			// own address, never the one dialled.
			if got, err := fetch(t, n, other, "allowed.test", overTLS); err != nil || got != "allowed.test at "+allowed {
				t.Errorf("allowed name, other address: %q, %v", got, err)
			}
			before, _ := n.Denied()
			if got, err := fetch(t, n, other, "other.test", overTLS); err == nil {
				t.Errorf("a name no rule allows was reached: %q", got)
			}
			if got, err := fetch(t, n, allowed, allowed, overTLS); err == nil {
				t.Errorf("a bare address was reached: %q", got)
			}
			if got, err := fetch(t, n, allowed, "private.test", overTLS); err == nil {
				t.Errorf("a private address was reached: %q", got)
			}
			if after, _ := n.Denied(); after < before+3 {
				t.Errorf("denied counter %d -> %d after three refusals", before, after)
			}
		})
	}
	if err := dialFromSandbox(t, n, netnstest.PublicAddr); err == nil {
		t.Error("a domain rule opened another port")
	}
	for name, want := range map[string]string{"allowed.test": allowed, "www.allowed.test": allowed, "other.test": "REFUSED"} {
		if got, err := resolve(t, n, name); err != nil || got != want {
			t.Errorf("resolve %s = %q, %v; want %q", name, got, err, want)
		}
	}

	// An address rule still opens its address, by any name.
	if err := n.SetPolicy(Policy{Domains: []string{"allowed.test"}, AllowOut: []netip.Prefix{netip.MustParsePrefix(other + "/32")}}); err != nil {
		t.Fatal(err)
	}
	if got, err := fetch(t, n, other, "other.test", true); err != nil || got != "other.test at "+other {
		t.Errorf("address allowed: %q, %v", got, err)
	}

	// Internet on: every name resolves (unknown ones as upstream says).
	if err := n.SetPolicy(Policy{AllowInternet: true}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"other.test": other, "nowhere.test": "NXDOMAIN"} {
		if got, err := resolve(t, n, name); err != nil || got != want {
			t.Errorf("resolve %s = %q, %v; want %q", name, got, err, want)
		}
	}
	if got, err := fetch(t, n, other, "anything.test", false); err != nil || got != "anything.test at "+other {
		t.Errorf("internet on, no domain rules: %q, %v", got, err)
	}
	// Internet off, no domain rules: nothing resolves.
	if err := n.SetPolicy(Policy{}); err != nil {
		t.Fatal(err)
	}
	if got, err := resolve(t, n, "other.test"); err != nil || got != "REFUSED" {
		t.Errorf("closed sandbox resolved a name: %q, %v", got, err)
	}
	_ = context.Background
}
