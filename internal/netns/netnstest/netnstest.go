// Package netnstest builds throwaway test hosts in network namespaces, so
// that egress tests have somewhere to connect without a packet leaving the
// machine.
package netnstest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
)

// Addresses of the fake internet host. On every address it serves TCP on
// :8080 (it answers "hi" and closes), HTTP on :80 and HTTPS on :443 (a
// certificate for the test names that Root signs); both answer "<Host or
// SNI> at <the address the client reached>", except on /echo (the request
// as JSON: Echo) and /stream (three lines, 200 ms apart, each flushed).
const (
	PublicAddr  = "203.0.113.10:8080" // TEST-NET-3
	OtherIP     = "203.0.113.20"      // a second public host
	PrivateAddr = "10.99.0.10:8080"
	HostSide    = "203.0.113.1" // the host's address on the test link
)

// Names the fake resolver (ServeDNS) knows.
var Names = map[string]string{
	"allowed.test.":     "203.0.113.10",
	"www.allowed.test.": "203.0.113.10",
	"other.test.":       OtherIP,
	"private.test.":     "10.99.0.10",
}

// FakeInternet makes the test host and routes to it from the host. It is
// removed when the test ends.
func FakeInternet(t testing.TB) {
	t.Helper()
	name := fmt.Sprintf("cftinet%d", time.Now().UnixNano()%100000)
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	sh("netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	sh("link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name)
	// Deleting the link is immediate; a namespace lingers until its last
	// socket closes, and with it the test net's addresses and routes.
	t.Cleanup(func() { exec.Command("ip", "link", "del", name).Run() })
	sh("addr", "add", HostSide+"/24", "dev", name)
	sh("addr", "add", "10.99.0.1/24", "dev", name)
	sh("link", "set", name, "up")
	sh("-n", name, "addr", "add", "203.0.113.10/24", "dev", "eth0")
	sh("-n", name, "addr", "add", OtherIP+"/24", "dev", "eth0")
	sh("-n", name, "addr", "add", "10.99.0.10/24", "dev", "eth0")
	sh("-n", name, "link", "set", "eth0", "up")
	sh("-n", name, "link", "set", "lo", "up")
	sh("-n", name, "route", "add", "default", "via", HostSide)
	ln, err := listenIn(name, ":8080")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	serveWeb(t, name)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
}

// serveWeb starts the HTTP and HTTPS servers of the fake host.
func serveWeb(t testing.TB, ns string) {
	t.Helper()
	answer := func(name string, c net.Conn) string {
		return fmt.Sprintf("%s at %s", name, c.LocalAddr().(*net.TCPAddr).IP)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := r.Context().Value(connKey{}).(net.Conn)
		name := r.Host
		if r.TLS != nil {
			name = r.TLS.ServerName
		}
		switch r.URL.Path {
		case "/echo":
			body, _ := io.ReadAll(r.Body)
			e := Echo{Host: r.Host, Method: r.Method, URI: r.RequestURI, Headers: http.Header{}, Body: string(body),
				At: c.LocalAddr().(*net.TCPAddr).IP.String()}
			for k, vs := range r.Header {
				for _, v := range vs {
					e.Headers[k] = append(e.Headers[k], Digest(v))
				}
			}
			if r.TLS != nil {
				e.SNI = r.TLS.ServerName
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(e)
		case "/stream":
			for i := range 3 {
				if i > 0 {
					time.Sleep(200 * time.Millisecond)
				}
				fmt.Fprintf(w, "line %d\n", i)
				w.(http.Flusher).Flush()
			}
		default:
			io.WriteString(w, answer(name, c))
		}
	})
	cert := serverCert(t)
	for _, port := range []string{":80", ":443"} {
		ln, err := listenIn(ns, port)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		}}
		if port == ":443" {
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
		}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	}
}

type connKey struct{}

// Echo is what /echo answers: the request as the host saw it. Header
// values are Digests, so that a secret a test sends through the egress
// proxy does not come back into the sandbox in the answer.
type Echo struct {
	Host    string      `json:"host"`
	SNI     string      `json:"sni"`
	Method  string      `json:"method"`
	URI     string      `json:"uri"`
	Headers http.Header `json:"headers"` // values: Digest(value)
	Body    string      `json:"body"`
	At      string      `json:"at"` // the address the client reached
}

// Digest stands for a header value in an Echo.
func Digest(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:12])
}

// testRoot is the fake internet's certificate authority, one per test
// process (a daemon the tests start can be told to trust it: RootPEM).
var testRoot = sync.OnceValues(func() (*x509.Certificate, *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cellfork fake internet root"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		panic(err)
	}
	return cert, key
})

// RootPEM is the certificate of the authority that signs the fake
// internet's HTTPS certificate.
func RootPEM() []byte {
	cert, _ := testRoot()
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// RootPool is a pool holding only RootPEM's certificate.
func RootPool() *x509.CertPool {
	cert, _ := testRoot()
	p := x509.NewCertPool()
	p.AddCert(cert)
	return p
}

// serverCert is the fake host's certificate for the test names, signed by
// the test root.
func serverCert(t testing.TB) tls.Certificate {
	t.Helper()
	root, rootKey := testRoot()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"*.test", "allowed.test", "*.allowed.test"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root, &key.PublicKey, rootKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// ServeDNS runs a resolver on loopback that knows Names (and nothing
// else: NXDOMAIN), for a daemon's or a Config's upstream. It returns its
// address and a function that stops it.
func ServeDNS() (addr string, stop func(), err error) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg).SetReply(q)
		name := strings.ToLower(q.Question[0].Name)
		ip, ok := Names[name]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.ParseIP(ip)})
		}
		w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: h}
	go srv.ActivateAndServe()
	return pc.LocalAddr().String(), func() { pc.Close() }, nil
}

// listenIn opens a TCP listener on addr inside the named namespace.
func listenIn(name, addr string) (net.Listener, error) {
	h, err := netns.GetFromName(name)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	if err := netns.Set(h); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	ln, lerr := net.Listen("tcp4", addr)
	if err := netns.Set(orig); err != nil {
		return nil, err // the thread stays locked and dies with this goroutine
	}
	runtime.UnlockOSThread()
	return ln, lerr
}
