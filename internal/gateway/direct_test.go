package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/clusterauth"
)

// upstream is a stand-in host for the forwarding tests: /echo answers
// with what it received, the others with what their names say.
func upstream(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { // /echo...
		body, _ := io.ReadAll(r.Body)
		h := r.Header.Clone()
		signed := h.Get(clusterauth.HeaderSig) != ""
		if _, err := clusterauth.Verify(r, [][]byte{testInternalKey}, time.Now()); err != nil {
			signed = false
		}
		for k := range h {
			if strings.HasPrefix(k, "Cellfork-") {
				delete(h, k) // times differ from one request to the next
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "dropped")
		w.Header().Set("Keep-Alive", "timeout=5")
		_ = json.NewEncoder(w).Encode(map[string]any{"method": r.Method, "uri": r.RequestURI, "host": r.Host,
			"header": h, "body": string(body), "length": r.ContentLength, "te": r.TransferEncoding, "signed": signed})
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for i := range 3 {
			fmt.Fprintf(w, `{"n":%d}`+"\n", i)
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/trailers", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		_, _ = io.WriteString(w, "body")
		w.Header().Set("X-Sum", "42")
		w.Header().Set(http.TrailerPrefix+"X-Late", "yes")
	})
	mux.HandleFunc("/hints", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		_, _ = io.WriteString(w, "after hints")
	})
	mux.HandleFunc("/close", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		_, _ = io.WriteString(w, "bye")
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, strings.Repeat("0123456789abcdef", 20000))
	})
	mux.HandleFunc("/nocontent", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "7")
		w.WriteHeader(http.StatusTeapot)
		_, _ = io.WriteString(w, "teapot!")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// answer is what a client saw, less what differs between two requests.
type answer struct {
	Status   int
	Header   http.Header
	Body     string
	Trailer  http.Header
	Err      string
	Interims []int
}

func ask(t *testing.T, c *http.Client, base string, dp http.Header, method, path string, body io.Reader, h map[string][]string) answer {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, body)
	req.Header = dp.Clone()
	req.Host = "49999-sandbox.eu.example.com" // the same for both gateways
	for k, v := range h {
		req.Header[k] = v
	}
	if v, ok := h["Host"]; ok {
		req.Host = v[0]
	}
	var interims []int
	req = req.WithContext(withInterims(req.Context(), &interims))
	resp, err := c.Do(req)
	if err != nil {
		return answer{Err: err.Error()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a := answer{Status: resp.StatusCode, Header: resp.Header, Body: string(b), Trailer: resp.Trailer, Interims: interims}
	if err != nil {
		a.Err = err.Error()
	}
	for _, k := range []string{"Date", "X-Request-Id", "Server-Timing"} {
		a.Header.Del(k)
	}
	return a
}

// TestDirectMatchesReverseProxy: the direct forwarding answers every
// request as the reverse proxy does, the request the host sees included.
func TestDirectMatchesReverseProxy(t *testing.T) {
	up := upstream(t)
	direct, dp := newRouting(t, up, false)
	proxied, _ := newRouting(t, up, true) // the same keys: dp is good for both
	small := strings.Repeat("x", smallBody)
	for _, tc := range []struct {
		name, method, path, body string
		h                        map[string][]string
	}{
		{"get", "GET", "/echo", "", nil},
		{"post small", "POST", "/echo", `{"code":"1"}`, map[string][]string{"Content-Type": {"application/json"}}},
		{"post empty", "POST", "/echo", "", nil},
		{"put at the bound", "PUT", "/echo", small, nil},
		{"post past the bound (streamed)", "POST", "/echo", small + "y", nil},
		{"delete", "DELETE", "/echo", "", nil},
		{"head", "HEAD", "/big", "", nil},
		{"query", "GET", "/echo?path=%2Fhome%2Fuser%2Fa%20b.txt&username=user&x=1", "", nil},
		{"query the proxy rewrites", "GET", "/echo?a=1;b=2", "", nil},
		{"escaped path", "GET", "/echo%2Fx", "", nil},
		{"hop-by-hop headers", "GET", "/echo", "", map[string][]string{"Connection": {"X-Private, keep-alive"}, "X-Private": {"secret"},
			"Keep-Alive": {"300"}, "Te": {"trailers, deflate"}, "Proxy-Authorization": {"Basic x"}, "Forwarded": {"for=1.2.3.4"},
			"X-Forwarded-For": {"1.2.3.4"}, "X-Forwarded-Host": {"h"}, "X-Forwarded-Proto": {"https"}, "X-Multi": {"a", "b"}}},
		{"no user agent", "GET", "/echo", "", map[string][]string{"User-Agent": {""}}},
		{"a user agent", "GET", "/echo", "", map[string][]string{"User-Agent": {"e2b-python-sdk/1.0"}}},
		{"another host header", "GET", "/echo", "", map[string][]string{"Host": {"8080-isb.eu.example.com"}}},
		{"streamed answer", "GET", "/stream", "", nil},
		{"trailers", "GET", "/trailers", "", map[string][]string{"Te": {"trailers"}}},
		{"early hints", "GET", "/hints", "", nil},
		{"connection close", "GET", "/close", "", nil},
		{"big answer", "GET", "/big", "", nil},
		{"no content", "POST", "/nocontent", "", nil},
		{"status and length", "GET", "/status", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got [2]answer
			for i, base := range []string{direct.URL, proxied.URL} {
				var body io.Reader
				if tc.body != "" {
					body = strings.NewReader(tc.body)
				}
				c := &http.Client{}
				got[i] = ask(t, c, base, dp, tc.method, tc.path, body, tc.h)
				c.CloseIdleConnections()

			}
			if got[0].Status == 0 || got[0].Err != "" {
				t.Fatalf("direct: %+v", got[0])
			}
			normalize := func(a *answer) {
				var m map[string]any
				if json.Unmarshal([]byte(a.Body), &m) == nil {
					b, _ := json.Marshal(m)
					a.Body = string(b)
				}
			}
			normalize(&got[0])
			normalize(&got[1])
			if !reflect.DeepEqual(got[0], got[1]) {
				t.Errorf("direct and reverse proxy differ:\ndirect: %.600s\nproxied: %.600s", fmt.Sprintf("%+v", got[0]), fmt.Sprintf("%+v", got[1]))
			}
			if strings.HasPrefix(tc.path, "/echo") && !strings.Contains(got[0].Body, `"signed":true`) {
				t.Errorf("the host saw an unsigned request: %s", got[0].Body)
			}
		})
	}
}

func withInterims(ctx context.Context, codes *[]int) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
		*codes = append(*codes, code)
		return nil
	}})
}

// TestDirectStreams: the header of an answer, and then each event of it,
// reach the client while the host is still answering.
func TestDirectStreams(t *testing.T) {
	next := make(chan struct{})
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for i := range 3 {
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
			fmt.Fprintf(w, "event %d\n", i)
			w.(http.Flusher).Flush()
		}
	}))
	defer host.Close()
	gw, dp := newRouting(t, host, false)
	req, _ := http.NewRequest("POST", gw.URL+"/execute", strings.NewReader(`{"code":"1"}`))
	req.Header = dp.Clone()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req) // returns with the header
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		select { // the host goes on only once the client has what came before
		case next <- struct{}{}:
		case <-time.After(10 * time.Second):
			t.Fatal("the host is not answering")
		}
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("event %d\n", i) {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
	}
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Errorf("after the events: %q", rest)
	}
}

// TestDirectConnections: one kept-alive connection serves a sandbox's
// requests one after another; one the host closed while idle is not
// used; a host that is down is a clear 502.
func TestDirectConnections(t *testing.T) {
	var conns atomic.Int64
	host := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	}))
	host.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	host.Start()
	gw, dp := newRouting(t, host, false)
	c := &http.Client{}
	get := func() (int, string) {
		req, _ := http.NewRequest("POST", gw.URL+"/execute", strings.NewReader("1"))
		req.Header = dp.Clone()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for range 10 {
		if st, body := get(); st != 200 || body != "ok" {
			t.Fatalf("%d %s", st, body)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("10 requests took %d connections to the host, want 1", n)
	}
	host.CloseClientConnections() // as a host restarting, or timing out idle connections, does
	time.Sleep(50 * time.Millisecond)
	if st, body := get(); st != 200 || body != "ok" {
		t.Errorf("after the host closed the idle connection: %d %s", st, body)
	}
	host.Close()
	if st, body := get(); st != http.StatusBadGateway || !strings.Contains(body, "its host does not answer") {
		t.Errorf("the host down: %d %s", st, body)
	}
}

// TestDirectCancel: a client that goes away ends the host's request; a
// host that dies mid-answer cuts the client's answer short (an error,
// never a clean end).
func TestDirectCancel(t *testing.T) {
	gone := make(chan struct{})
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			w.Header().Set("Content-Type", "application/x-ndjson")
			_, _ = io.WriteString(w, "started\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			close(gone)
		case "/dies":
			_, _ = io.WriteString(w, "partial\n")
			w.(http.Flusher).Flush()
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.Close()
		}
	}))
	defer host.Close()
	gw, dp := newRouting(t, host, false)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", gw.URL+"/slow", nil)
	req.Header = dp.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if line != "started\n" {
		t.Fatalf("first line %q", line)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the host's request went on after the client left")
	}

	req, _ = http.NewRequest("GET", gw.URL+"/dies", nil)
	req.Header = dp.Clone()
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Errorf("a host dying mid-answer read as a clean end: %q", b)
	}
}
