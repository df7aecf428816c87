package netns

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// clientHello returns the first bytes a TLS client sends for serverName.
func clientHello(t testing.TB, serverName string) []byte {
	a, b := net.Pipe()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true})
		c.SetDeadline(time.Now().Add(time.Second))
		c.Handshake()
		a.Close()
	}()
	b.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 64<<10)
	n, _ := io.ReadAtLeast(b, buf, 5)
	b.Close()
	return buf[:n]
}

func TestPeekName(t *testing.T) {
	for _, c := range []struct {
		in    []byte
		isTLS bool
		want  string
	}{
		{clientHello(t, "Example.COM"), true, "example.com"},
		{clientHello(t, ""), true, ""},
		{[]byte("GET / HTTP/1.1\r\nHost: API.example.com:8080\r\n\r\n"), false, "api.example.com"},
		{[]byte("GET / HTTP/1.1\r\nHost: 203.0.113.10\r\n\r\n"), false, ""},
		{[]byte("GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"), false, ""},
		{[]byte("GET / HTTP/1.1\r\nHost: example.com."), false, ""}, // headers never end
		{[]byte("\x16\x03\x01\x00\x05hello"), true, ""},
	} {
		if got := peekName(bytes.NewReader(c.in), c.isTLS); got != c.want {
			t.Errorf("peekName(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func FuzzPeekName(f *testing.F) {
	f.Add(clientHello(f, "allowed.test"), true)
	f.Add([]byte("GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"), false)
	f.Add([]byte("CONNECT allowed.test:443 HTTP/1.1\r\n\r\n"), false)
	f.Add([]byte("GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"), false)
	f.Fuzz(func(t *testing.T, in []byte, isTLS bool) {
		r := &countingReader{r: io.LimitReader(bytes.NewReader(in), peekLimit)}
		name := peekName(r, isTLS)
		if name != strings.ToLower(name) || strings.HasSuffix(name, ".") {
			t.Fatalf("name %q is not normalised", name)
		}
		if _, err := netip.ParseAddr(name); err == nil {
			t.Fatalf("an address %q came back as a name", name)
		}
		if r.n > peekLimit {
			t.Fatalf("read %d bytes, past the limit", r.n)
		}
	})
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
