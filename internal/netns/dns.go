package netns

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// The sandbox's nameserver is its gateway: a resolver the daemon runs in
// the router namespace. It answers under the sandbox's policy (a closed
// sandbox resolves only the names its domain rules allow) by asking the
// daemon's upstream resolvers from the daemon's own namespace, so the
// sandbox never talks to a resolver itself.

const dnsTimeout = 3 * time.Second

// UpstreamDNS returns the nameservers of a resolv.conf as host:port, for
// Config.DNS.
func UpstreamDNS(resolvConf string) ([]string, error) {
	cc, err := dns.ClientConfigFromFile(resolvConf)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(cc.Servers))
	for _, s := range cc.Servers {
		out = append(out, net.JoinHostPort(s, cc.Port))
	}
	return out, nil
}

// exchange asks the upstream resolvers in turn, over TCP when an answer
// was truncated.
func (c *Config) exchange(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
	if len(c.DNS) == 0 {
		return nil, errors.New("no upstream resolver configured")
	}
	ctx, cancel := context.WithTimeout(ctx, dnsTimeout)
	defer cancel()
	var errs []error
	for _, server := range c.DNS {
		r, _, err := (&dns.Client{Net: "udp"}).ExchangeContext(ctx, q, server)
		if err == nil && r.Truncated {
			r, _, err = (&dns.Client{Net: "tcp"}).ExchangeContext(ctx, q, server)
		}
		if err == nil {
			return r, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// lookup4 resolves name to its IPv4 addresses through the upstream
// resolvers.
func (c *Config) lookup4(ctx context.Context, name string) ([]netip.Addr, error) {
	q := new(dns.Msg).SetQuestion(dns.Fqdn(name), dns.TypeA)
	r, err := c.exchange(ctx, q)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				out = append(out, ip)
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no IPv4 address")
	}
	return out, nil
}

// ServeDNS answers one query from the sandbox (the network is the
// resolver's handler).
func (n *Network) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	reply := func(code int) {
		m := new(dns.Msg).SetRcode(q, code)
		_ = w.WriteMsg(m)
	}
	if len(q.Question) != 1 || q.Opcode != dns.OpcodeQuery {
		reply(dns.RcodeNotImplemented)
		return
	}
	name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
	if p := n.currentPolicy(); !resolves(&p, name) {
		n.dnsRefused.Add(1)
		reply(dns.RcodeRefused)
		return
	}
	r, err := n.cfg.exchange(context.Background(), q)
	if err != nil {
		reply(dns.RcodeServerFailure)
		return
	}
	r.Id = q.Id
	r.Compress = true
	_ = w.WriteMsg(r)
}

// serve starts the network's resolver (UDP and TCP port 53) and proxy
// listeners on the gateway address in the router namespace. Close stops
// them and every connection they carry.
func (n *Network) serve() error {
	var (
		udp             net.PacketConn
		tcp, http, tlsL net.Listener
	)
	gw := func(port string) string { return net.JoinHostPort(GatewayIP, port) }
	err := inNS(n.router, func() error {
		var err error
		if udp, err = net.ListenPacket("udp4", gw("53")); err != nil {
			return err
		}
		if tcp, err = net.Listen("tcp4", gw("53")); err != nil {
			return err
		}
		if http, err = net.Listen("tcp4", gw(strconv.Itoa(httpProxyPort))); err != nil {
			return err
		}
		tlsL, err = net.Listen("tcp4", gw(strconv.Itoa(tlsProxyPort)))
		return err
	})
	all := []io.Closer{udp, tcp, http, tlsL}
	closeAll := func() {
		for _, c := range all {
			if c != nil {
				c.Close()
			}
		}
	}
	if err != nil {
		closeAll()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.stop = cancel
	udpSrv := &dns.Server{PacketConn: udp, Handler: n}
	tcpSrv := &dns.Server{Listener: tcp, Handler: n, ReadTimeout: dnsTimeout, WriteTimeout: dnsTimeout}
	go func() { _ = udpSrv.ActivateAndServe() }()
	go func() { _ = tcpSrv.ActivateAndServe() }()
	go n.acceptProxy(ctx, http, false)
	go n.acceptProxy(ctx, tlsL, true)
	context.AfterFunc(ctx, func() {
		_ = udpSrv.Shutdown()
		_ = tcpSrv.Shutdown()
		closeAll() // in case a server had not started yet
	})
	return nil
}
