package netns

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/netns/netnstest"
)

// tlsFromSandbox opens a TLS connection from the sandbox to ip:443 for
// the server name, trusting roots only, offering protos.
func tlsFromSandbox(t *testing.T, n *Network, ip, name string, roots *x509.CertPool, protos ...string) (*tls.Conn, error) {
	t.Helper()
	var c net.Conn
	err := fromSandbox(t, n, func() error {
		var err error
		c, err = net.DialTimeout("tcp4", net.JoinHostPort(ip, "443"), 2*time.Second)
		return err
	})
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: roots, NextProtos: protos})
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// echo sends one request over c (kept alive) and decodes the host's echo.
func echo(t *testing.T, c net.Conn, br *bufio.Reader, host, method, body string, headers map[string]string) (netnstest.Echo, int) {
	t.Helper()
	req, _ := http.NewRequest(method, "https://"+host+"/echo?a=1;b=2", strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	if err := req.Write(c); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e netnstest.Echo
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
			t.Fatal(err)
		}
	}
	return e, resp.StatusCode
}

func TestNetworkRules(t *testing.T) {
	blocked, err := HostNetworks()
	if err != nil {
		t.Fatal(err)
	}
	upstream, stop, err := netnstest.ServeDNS()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ca, err := LoadCA(filepath.Join(t.TempDir(), "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caPool := x509.NewCertPool()
	caPool.AppendCertsFromPEM(ca.CertPEM())
	cfg := &Config{HostBlocked: blocked, DNS: []string{upstream}, CA: ca, UpstreamRoots: netnstest.RootPool()}
	n := testNetwork(t, "cftest-rules", cfg)
	const allowed, secret = "203.0.113.10", "Bearer sk-test-0123456789"
	rules := func(v string) map[string]map[string]string {
		return map[string]map[string]string{
			"allowed.test":   {"Authorization": v, "X-Team": "t1"},
			"*.allowed.test": {"X-Wild": "w"},
		}
	}
	if err := n.SetPolicy(Policy{AllowInternet: true, Transforms: rules(secret)}); err != nil {
		t.Fatal(err)
	}

	// The ruled host gets the headers, over one kept-alive connection;
	// the sandbox's own Authorization is replaced; a rule changed between
	// two requests applies to the second.
	c, err := tlsFromSandbox(t, n, allowed, "allowed.test", caPool, "h2", "http/1.1")
	if err != nil {
		t.Fatalf("TLS to a ruled host with the CA trusted: %v", err)
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != "http/1.1" {
		t.Errorf("ALPN %q, want http/1.1", p)
	}
	br := bufio.NewReader(c)
	e, code := echo(t, c, br, "allowed.test", "POST", "payload", map[string]string{"Authorization": "mine", "X-Mine": "kept"})
	if code != 200 || e.Headers.Get("Authorization") != netnstest.Digest(secret) || len(e.Headers["Authorization"]) != 1 ||
		e.Headers.Get("X-Team") != netnstest.Digest("t1") || e.Headers.Get("X-Mine") != netnstest.Digest("kept") || e.Headers.Get("X-Wild") != "" {
		t.Errorf("ruled request: %d %+v", code, e.Headers)
	}
	if e.SNI != "allowed.test" || e.Host != "allowed.test" || e.Body != "payload" || e.Method != "POST" || e.URI != "/echo?a=1;b=2" {
		t.Errorf("ruled request reached the host as %+v", e)
	}
	if err := n.SetPolicy(Policy{AllowInternet: true, Transforms: rules("Bearer rotated")}); err != nil {
		t.Fatal(err)
	}
	if e, code := echo(t, c, br, "allowed.test", "GET", "", nil); code != 200 || e.Headers.Get("Authorization") != netnstest.Digest("Bearer rotated") {
		t.Errorf("second request on the connection: %d %+v", code, e.Headers)
	}
	// A request for another host over the ruled name's TLS is refused.
	if _, code := echo(t, c, br, "other.test", "GET", "", nil); code != http.StatusMisdirectedRequest {
		t.Errorf("Host other than the server name: %d, want 421", code)
	}
	c.Close()

	// Answers stream: the first line arrives before the host wrote the last.
	c, err = tlsFromSandbox(t, n, allowed, "allowed.test", caPool)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	fmt.Fprintf(c, "GET /stream HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := bufio.NewReader(resp.Body).ReadString('\n')
	tFirst := time.Since(t0)
	rest, _ := io.ReadAll(resp.Body)
	if first != "line 0\n" || tFirst > 300*time.Millisecond || time.Since(t0) < 400*time.Millisecond {
		t.Errorf("stream: first line %q after %v, rest %q after %v", first, tFirst, rest, time.Since(t0))
	}
	c.Close()

	// The wildcard rule, for a subdomain (the exact rule is not its).
	c, err = tlsFromSandbox(t, n, allowed, "www.allowed.test", caPool)
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := echo(t, c, bufio.NewReader(c), "www.allowed.test", "GET", "", nil); e.Headers.Get("X-Wild") != netnstest.Digest("w") || e.Headers.Get("Authorization") != "" {
		t.Errorf("wildcard rule: %+v", e.Headers)
	}
	c.Close()

	// A name without a rule passes through untouched: the host's own
	// certificate, no headers added.
	c, err = tlsFromSandbox(t, n, netnstest.OtherIP, "other.test", netnstest.RootPool())
	if err != nil {
		t.Fatalf("TLS to a host without a rule: %v", err)
	}
	if e, _ := echo(t, c, bufio.NewReader(c), "other.test", "GET", "", nil); e.Headers.Get("Authorization") != "" || e.Headers.Get("X-Team") != "" {
		t.Errorf("a host without a rule got headers: %+v", e.Headers)
	}
	c.Close()
	// Plain HTTP is never transformed (a secret never goes out in clear).
	if got, err := fetch(t, n, allowed, "allowed.test", false); err != nil || got != "allowed.test at "+allowed {
		t.Errorf("plain HTTP to the ruled host: %q, %v", got, err)
	}

	// Rules grant no access: with the internet off and another name
	// allowed, the ruled host is refused like any other.
	if err := n.SetPolicy(Policy{Domains: []string{"www.allowed.test"}, Transforms: rules(secret)}); err != nil {
		t.Fatal(err)
	}
	before, _ := n.Denied()
	if _, err := tlsFromSandbox(t, n, allowed, "allowed.test", caPool); err == nil {
		t.Error("a rule opened a host the policy refuses")
	}
	if after, _ := n.Denied(); after != before+1 {
		t.Errorf("denied counter %d -> %d", before, after)
	}
	c, err = tlsFromSandbox(t, n, allowed, "www.allowed.test", caPool)
	if err != nil {
		t.Fatalf("allowed and ruled name: %v", err)
	}
	if e, _ := echo(t, c, bufio.NewReader(c), "www.allowed.test", "GET", "", nil); e.Headers.Get("X-Wild") != netnstest.Digest("w") {
		t.Errorf("allowed and ruled name: %+v", e.Headers)
	}
	c.Close()

	// No rules: nothing is intercepted.
	if err := n.SetPolicy(Policy{AllowInternet: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := tlsFromSandbox(t, n, allowed, "allowed.test", caPool); err == nil {
		t.Error("TLS was terminated with no rule")
	}
	// Without a CA, rules are refused.
	if err := (&Network{cfg: &Config{}}).SetPolicy(Policy{Transforms: rules(secret)}); err == nil {
		t.Error("rules accepted without a CA")
	}
}

// The host's certificate is verified for the name: a host the proxy cannot
// verify never sees the request (nor the headers).
func TestNetworkRulesVerifyHost(t *testing.T) {
	blocked, err := HostNetworks()
	if err != nil {
		t.Fatal(err)
	}
	upstream, stop, err := netnstest.ServeDNS()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ca, err := LoadCA(filepath.Join(t.TempDir(), "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caPool := x509.NewCertPool()
	caPool.AppendCertsFromPEM(ca.CertPEM())
	// The host's roots, which do not include the fake internet's.
	n := testNetwork(t, "cftest-verify", &Config{HostBlocked: blocked, DNS: []string{upstream}, CA: ca})
	if err := n.SetPolicy(Policy{AllowInternet: true, Transforms: map[string]map[string]string{"allowed.test": {"X-Secret": "s"}}}); err != nil {
		t.Fatal(err)
	}
	c, err := tlsFromSandbox(t, n, "203.0.113.10", "allowed.test", caPool)
	if err == nil {
		c.Close()
		t.Fatal("the proxy relayed to a host whose certificate it cannot verify")
	}
}
