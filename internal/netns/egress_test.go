package netns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/cellfork/cellfork/internal/netns/netnstest"
)

// dialFromSandbox connects from inside the sandbox namespace (a host
// socket there stands in for the sandbox's traffic).
func dialFromSandbox(t *testing.T, n *Network, addr string) error {
	t.Helper()
	s, err := netns.GetFromPath(n.SandboxPath())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var c net.Conn
	err = inNS(s, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp4", addr)
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 2)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(buf); err != nil || string(buf) != "hi" {
		return fmt.Errorf("read %q: %v", buf, err)
	}
	return nil
}

// testNetwork makes a network beside a fake internet, removed when the test
// ends.
func testNetwork(t *testing.T, name string, cfg *Config) *Network {
	t.Helper()
	requireRoot(t)
	netnstest.FakeInternet(t)
	if err := SetupHost(cfg.HostBlocked); err != nil {
		t.Fatal(err)
	}
	n, err := Create(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Destroy() })
	return n
}

func TestEgressPolicy(t *testing.T) {
	blocked, err := HostNetworks()
	if err != nil {
		t.Fatal(err)
	}
	n := testNetwork(t, "cftest-egress", &Config{HostBlocked: blocked})
	pub, priv := netnstest.PublicAddr, netnstest.PrivateAddr
	p := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, netip.MustParsePrefix(x))
		}
		return out
	}
	cases := []struct {
		name   string
		policy Policy
		addr   string
		ok     bool
	}{
		{"fresh network: no egress until a policy is set", Policy{}, pub, false},
		{"internet allowed", Policy{AllowInternet: true}, pub, true},
		{"internet off", Policy{AllowInternet: false}, pub, false},
		{"internet off, address allowed", Policy{AllowOut: p("203.0.113.10/32")}, pub, true},
		{"internet on, range denied", Policy{AllowInternet: true, DenyOut: p("203.0.113.0/24")}, pub, false},
		{"allow wins over deny (as in E2B)", Policy{AllowOut: p("203.0.113.10/32"), DenyOut: p("0.0.0.0/0")}, pub, true},
		{"deny", Policy{AllowInternet: true, DenyOut: p("203.0.113.10/32")}, pub, false},
		{"private range refused with internet on", Policy{AllowInternet: true}, priv, false},
		{"private range allowed explicitly", Policy{AllowOut: p("10.99.0.0/24")}, priv, true},
		{"the host's address on the test net", Policy{AllowInternet: true, AllowOut: p("203.0.113.0/24")}, netnstest.HostSide + ":22", false},
		{"metadata, even when allowed", Policy{AllowInternet: true, AllowOut: p("169.254.0.0/16")}, "169.254.169.254:80", false},
		{"the router itself, but for its resolver and proxy", Policy{AllowInternet: true}, GatewayIP + ":22", false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if i > 0 {
				if err := n.SetPolicy(c.policy); err != nil {
					t.Fatal(err)
				}
			}
			before, _ := n.Denied()
			start := time.Now()
			err := dialFromSandbox(t, n, c.addr)
			if c.ok && err != nil {
				t.Fatalf("want reachable: %v", err)
			}
			if !c.ok {
				if err == nil {
					t.Fatal("reached a destination the policy denies")
				}
				if time.Since(start) > time.Second {
					t.Errorf("denial took %v: it should be refused at once, not time out", time.Since(start))
				}
				if after, _ := n.Denied(); after <= before && c.addr != netnstest.HostSide+":22" {
					t.Errorf("denied counter did not move: %d -> %d", before, after)
				}
			}
		})
	}
}
