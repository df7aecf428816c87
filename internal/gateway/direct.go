package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/cellfork/cellfork/internal/clusterauth"
	"github.com/cellfork/cellfork/internal/timing"
)

// The data plane's common case is forwarded directly (forwardDirect): a
// request with no body or a small one (read whole by forward) is written
// to a kept-alive connection to the host and its answer streamed back,
// all from the handler's goroutine. It is what httputil.ReverseProxy over
// net/http's Transport does, less the Transport's two goroutines per
// connection: each request went through both, and on a small machine
// the wake-ups of those hand-offs were most of the gateway's cost.
// Anything else (a streamed body, an upgrade, Expect, a query the
// reverse proxy would rewrite) takes the reverse proxy, whose behaviour
// this matches (TestDirectMatchesReverseProxy).

// direct reports whether r can be forwarded directly.
func direct(r *http.Request, f *forwarding) bool {
	if !r.ProtoAtLeast(1, 1) || r.ProtoMajor != 1 || len(r.Header["Upgrade"]) > 0 || len(r.Header["Expect"]) > 0 || !cleanQuery(r.URL.RawQuery) {
		return false
	}
	return f.body != nil || r.ContentLength == 0 && (r.Body == nil || r.Body == http.NoBody)
}

// cleanQuery reports whether the reverse proxy would pass a query on as
// it is (it re-encodes one with a ';', a bad escape or too many
// parameters).
func cleanQuery(q string) bool {
	if strings.Count(q, "&") >= 1000 {
		return false
	}
	for i := 0; i < len(q); i++ {
		switch q[i] {
		case ';':
			return false
		case '%':
			if i+2 >= len(q) || !ishex(q[i+1]) || !ishex(q[i+2]) {
				return false
			}
			i += 2
		}
	}
	return true
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// hopHeaders are the hop-by-hop headers a proxy does not pass on (RFC
// 9110 7.6.1, and the reverse proxy's list).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for sf := range strings.SplitSeq(v, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				h.Del(sf)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// aLongTimeAgo is a deadline that has passed: it ends a connection's
// blocked reads and writes.
var aLongTimeAgo = time.Unix(1, 0)

// forwardDirect forwards r (with its body in f.body, or none) to f's
// host and streams the answer back.
func (g *Gateway) forwardDirect(w http.ResponseWriter, r *http.Request, f *forwarding) {
	h := r.Header.Clone()
	removeHopByHop(h)
	if httpguts.HeaderValuesContainsToken(r.Header["Te"], "trailers") {
		h.Set("Te", "trailers")
	}
	for _, k := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Request-Id", "Host", "Content-Length"} {
		h.Del(k)
	}
	if v, ok := h["User-Agent"]; ok && (len(v) == 0 || v[0] == "") {
		delete(h, "User-Agent") // none, as the reverse proxy sends
	}
	ctx := r.Context()
	timing.Inject(ctx, h)
	out := &http.Request{Method: r.Method, URL: r.URL, Header: h}
	clusterauth.Sign(out, g.secrets.Load().Internal, f.team, f.mint, time.Now())

	c, err := g.direct.get(ctx, f.host)
	if err != nil {
		g.proxyError(w, r, err)
		return
	}
	done := false // the exchange ended cleanly: the connection can serve another
	stop := context.AfterFunc(ctx, func() { _ = c.c.SetDeadline(aLongTimeAgo) })
	defer func() {
		if stop() && done {
			g.direct.put(c)
		} else {
			c.c.Close()
		}
	}()
	if err := writeRequest(c, out, r.Host, f.host, f.body); err != nil {
		g.proxyError(w, r, err)
		return
	}
	var resp *http.Response
	for {
		c.limitHeader()
		resp, err = http.ReadResponse(c.br, out)
		c.endHeader()
		if err != nil {
			g.proxyError(w, r, err)
			return
		}
		if resp.StatusCode >= 200 || resp.StatusCode < 100 {
			break
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			g.proxyError(w, r, errors.New("101 Switching Protocols to a request that did not ask to switch"))
			return
		}
		// 1xx (103 Early Hints): passed on as the reverse proxy does.
		rh := w.Header()
		copyHeader(rh, resp.Header)
		w.WriteHeader(resp.StatusCode)
		clear(rh)
	}
	f.end()
	removeHopByHop(resp.Header)
	copyHeader(w.Header(), resp.Header)
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		w.Header().Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(resp.StatusCode)
	// The reverse proxy sends the header at once, and so does this, unless
	// the body follows it already: a client waits for the header of a
	// run_code whose first output may be far off.
	if announced > 0 || resp.ContentLength != 0 && c.br.Buffered() == 0 {
		f.flushed.Store(true)
		_ = http.NewResponseController(w).Flush()
	}
	f.sized.Store(resp.ContentLength >= 0)
	if err := copyFlushing(w, resp.Body, f); err != nil {
		resp.Body.Close()
		// Streaming, all that can be done is to cut the answer short,
		// as the reverse proxy does.
		panic(http.ErrAbortHandler)
	}
	resp.Body.Close()
	done = !resp.Close
	if len(resp.Trailer) == announced {
		copyHeader(w.Header(), resp.Trailer)
		return
	}
	for k, vv := range resp.Trailer {
		for _, v := range vv {
			w.Header().Add(http.TrailerPrefix+k, v)
		}
	}
}

// writeRequest writes out (with body, if not nil) on c as net/http's
// Transport writes a request, in one write.
func writeRequest(c *hostConn, out *http.Request, host, addr string, body []byte) error {
	if host == "" {
		host = addr
	}
	var b bytes.Buffer
	b.Grow(1024)
	b.WriteString(out.Method)
	b.WriteByte(' ')
	b.WriteString(out.URL.RequestURI())
	b.WriteString(" HTTP/1.1\r\nHost: ")
	b.WriteString(host)
	b.WriteString("\r\n")
	switch {
	case body != nil:
		b.WriteString("Content-Length: ")
		b.WriteString(strconv.Itoa(len(body)))
		b.WriteString("\r\n")
	case out.Method == http.MethodPost || out.Method == http.MethodPut || out.Method == http.MethodPatch:
		b.WriteString("Content-Length: 0\r\n")
	}
	if err := out.Header.Write(&b); err != nil {
		return err
	}
	b.WriteString("\r\n")
	bufs := net.Buffers{b.Bytes(), body}
	_, err := bufs.WriteTo(c.c)
	return err
}

// copyFlushing copies an answer's body to w, flushing every write, as
// the reverse proxy does, but the one that reaches its end when f says
// it can be left to the server (skipFlush).
func copyFlushing(w http.ResponseWriter, body io.Reader, f *forwarding) error {
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	rc := http.NewResponseController(w)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			f.eof.Store(rerr == io.EOF)
			if !f.skipFlush() {
				f.flushed.Store(true)
				if err := rc.Flush(); err != nil {
					return err
				}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		for _, v := range vv {
			dst.Add(k, v)
		}
	}
}
