package netns

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The egress proxy enforces domain rules. When a policy has them, the
// router redirects the sandbox's TCP connections to ports 80 and 443 that
// no address rule allows to the proxy (SetPolicy), which reads the HTTP
// Host header or the TLS SNI, and then:
//   - a name a domain rule allows: connect to what the name resolves to
//     (through the upstream resolvers), never to the address the sandbox
//     asked for, so naming an allowed host while dialling another address
//     gets nowhere;
//   - anything else: the address rules decide, on the original
//     destination.
// The proxy dials from the router namespace, so its connections leave
// through the uplink like the sandbox's own and pass the host's filter.
// When the policy has network rules, every TLS connection to port 443
// comes here too, and those for a name with a rule are served by intercept
// (mitm.go).

const (
	httpProxyPort = 15080
	tlsProxyPort  = 15443
	peekTimeout   = 10 * time.Second // for the client's first bytes
	peekLimit     = 64 << 10         // bytes read looking for a name
	dialTimeout   = 10 * time.Second
)

func (n *Network) acceptProxy(ctx context.Context, ln net.Listener, isTLS bool) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go n.proxy(ctx, c.(*net.TCPConn), isTLS)
	}
}

// proxy handles one redirected connection.
func (n *Network) proxy(ctx context.Context, c *net.TCPConn, isTLS bool) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	orig, err := originalDst(c)
	if err != nil {
		return
	}
	var seen bytes.Buffer
	_ = c.SetReadDeadline(time.Now().Add(peekTimeout))
	name := peekName(io.TeeReader(io.LimitReader(c, peekLimit), &seen), isTLS)
	_ = c.SetReadDeadline(time.Time{})
	port := uint16(80)
	if isTLS {
		port = 443
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	up, err := n.dialAllowed(dctx, name, netip.AddrPortFrom(orig.Addr(), port))
	cancel()
	if err != nil {
		if errors.Is(err, errDenied) {
			n.proxyDenied.Add(1)
		}
		_ = c.SetLinger(0) // a reset, as the router answers denied connections
		return
	}
	defer up.Close()
	stopUp := context.AfterFunc(ctx, func() { up.Close() })
	defer stopUp()
	if isTLS && name != "" && n.cfg.CA != nil {
		if p := n.currentPolicy(); p.TransformFor(name) != nil {
			n.intercept(ctx, c, seen.Bytes(), name, up, netip.AddrPortFrom(orig.Addr(), port))
			return
		}
	}
	if _, err := up.Write(seen.Bytes()); err != nil {
		return
	}
	splice(c, up)
}

var errDenied = errors.New("denied by the egress policy")

// dialAllowed connects to what the policy allows for a connection that
// named name ("" if none) and was sent to orig.
func (n *Network) dialAllowed(ctx context.Context, name string, orig netip.AddrPort) (*net.TCPConn, error) {
	p := n.currentPolicy()
	if name != "" && allowsName(&p, name) {
		addrs, err := n.cfg.lookup4(ctx, name)
		if err != nil {
			return nil, err
		}
		// The address the sandbox chose, if the name has it, first.
		if i := slices.Index(addrs, orig.Addr()); i > 0 {
			addrs[0], addrs[i] = addrs[i], addrs[0]
		}
		for _, a := range addrs {
			if allowsResolved(&p, a, n.cfg.HostBlocked) {
				return n.dialFromRouter(ctx, netip.AddrPortFrom(a, orig.Port()))
			}
		}
		return nil, errDenied
	}
	if !allowsAddr(&p, orig.Addr(), n.cfg.HostBlocked) {
		return nil, errDenied
	}
	return n.dialFromRouter(ctx, orig)
}

// peekName reads the start of a connection for the name it is meant for:
// the TLS server name, or the HTTP Host (without port). "" if none.
func peekName(r io.Reader, isTLS bool) string {
	var name string
	if isTLS {
		// crypto/tls parses the ClientHello; the handshake is then
		// abandoned (nothing is written back).
		errStop := errors.New("stop")
		_ = tls.Server(readOnlyConn{r: r}, &tls.Config{
			GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
				name = h.ServerName
				return nil, errStop
			},
		}).Handshake()
	} else if req, err := http.ReadRequest(bufio.NewReader(r)); err == nil {
		name = req.Host
		if h, _, err := net.SplitHostPort(name); err == nil {
			name = h
		}
	}
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if _, err := netip.ParseAddr(name); err == nil {
		return "" // an address names no domain
	}
	return name
}

// readOnlyConn feeds a TLS server the bytes of r and swallows its replies.
type readOnlyConn struct {
	net.Conn
	r io.Reader
}

func (c readOnlyConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c readOnlyConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c readOnlyConn) Close() error                     { return nil }
func (c readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (c readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (c readOnlyConn) SetWriteDeadline(time.Time) error { return nil }
func (c readOnlyConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c readOnlyConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }

// originalDst is where the sandbox sent a redirected connection.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var dst netip.AddrPort
	var gerr error
	err = raw.Control(func(fd uintptr) {
		// The kernel answers with a sockaddr_in; IPv6Mreq is a 20-byte
		// buffer that holds one.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			gerr = err
			return
		}
		b := m.Multiaddr
		dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), uint16(b[2])<<8|uint16(b[3]))
	})
	return dst, errors.Join(err, gerr)
}

// splice copies both ways until both sides are done, passing half-closes on.
func splice(a, b *net.TCPConn) {
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(b, a)
		_ = b.CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(a, b)
	_ = a.CloseWrite()
	<-done
}
