package gateway

import (
	"bufio"
	"context"
	"io"
	"math"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// hostClient keeps the connections of the gateway's direct forwarding
// (forwardDirect): HTTP/1.1 keep-alive connections to hosts, each used
// by one request at a time from the handler's own goroutine. Safe for
// concurrent use.
type hostClient struct {
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle int           // per host
	idleFor time.Duration // an idle connection older than this is closed (hosts close theirs at 2 min)

	mu     sync.Mutex
	idle   map[string][]*hostConn // by address, the most recently used last
	closed bool
}

// hostConn is a connection to a host.
type hostConn struct {
	addr string
	c    net.Conn
	lim  *io.LimitedReader // under br: bounds an answer's header (limitHeader)
	br   *bufio.Reader
	used time.Time
}

// maxAnswerHeader bounds an answer's header, as net/http's Transport
// does by default.
const maxAnswerHeader = 10 << 20

// limitHeader bounds what is read from the connection until endHeader.
func (c *hostConn) limitHeader() { c.lim.N = maxAnswerHeader }

func (c *hostConn) endHeader() { c.lim.N = math.MaxInt64 }

func newHostClient(d *net.Dialer) *hostClient {
	return &hostClient{dial: d.DialContext, maxIdle: 256, idleFor: 90 * time.Second, idle: map[string][]*hostConn{}}
}

// get returns an idle connection to addr that is still open, or a new
// one.
func (hc *hostClient) get(ctx context.Context, addr string) (*hostConn, error) {
	hc.mu.Lock()
	for list := hc.idle[addr]; len(list) > 0; list = hc.idle[addr] {
		c := list[len(list)-1]
		hc.idle[addr] = list[:len(list)-1]
		hc.mu.Unlock()
		if time.Since(c.used) < hc.idleFor && c.quiet() {
			return c, nil
		}
		c.c.Close()
		hc.mu.Lock()
	}
	hc.mu.Unlock()
	conn, err := hc.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	lim := &io.LimitedReader{R: conn, N: math.MaxInt64}
	return &hostConn{addr: addr, c: conn, lim: lim, br: bufio.NewReaderSize(lim, 4<<10)}, nil
}

// put keeps a connection whose exchange ended cleanly for the next
// request, and closes those idle too long.
func (hc *hostClient) put(c *hostConn) {
	c.used = time.Now()
	hc.mu.Lock()
	defer hc.mu.Unlock()
	list := hc.idle[c.addr]
	for len(list) > 0 && c.used.Sub(list[0].used) >= hc.idleFor {
		list[0].c.Close()
		list = list[1:]
	}
	if hc.closed || len(list) >= hc.maxIdle {
		c.c.Close()
	} else {
		list = append(list, c)
	}
	hc.idle[c.addr] = list
}

// closeIdle closes every idle connection; with stop, it keeps none from
// then on.
func (hc *hostClient) closeIdle(stop bool) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	for addr, list := range hc.idle {
		for _, c := range list {
			c.c.Close()
		}
		delete(hc.idle, addr)
	}
	hc.closed = hc.closed || stop
}

// quiet reports whether an idle connection is still open with nothing to
// read: a host that closed it (restarted, or its idle timeout) would
// otherwise fail the request written on it. One non-blocking peek.
func (c *hostConn) quiet() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	sc, ok := c.c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	quiet := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		quiet = rerr == unix.EAGAIN // else closed (0 bytes), data or an error
		return true
	})
	return err == nil && quiet
}
