package gateway

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/ids"
)

// dataPlaneRig is a gateway routing to one host, an in-process stand-in
// that answers as a run_code does (NDJSON, flushed per event).
type dataPlaneRig struct {
	host, gw *httptest.Server
	headers  http.Header
}

func newDataPlaneRig(tb testing.TB) *dataPlaneRig {
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("Server-Timing", "route;dur=0.01, upstream;dur=1.00, total;dur=1.05")
		_, _ = io.WriteString(w, `{"type":"result","text":"1","is_main_result":true}`+"\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, `{"type":"end_of_execution"}`+"\n")
	}))
	tb.Cleanup(host.Close)
	gw, h := newRouting(tb, host, false)
	return &dataPlaneRig{host: host, gw: gw, headers: h}
}

// newRouting serves a gateway whose one host is host, and returns it
// with the data-plane headers of a sandbox on that host (port 49999, its
// token). noDirect sends everything through the reverse proxy.
func newRouting(tb testing.TB, host *httptest.Server, noDirect bool) (*httptest.Server, http.Header) {
	g := New(Config{Log: slog.New(slog.DiscardHandler)})
	g.noDirect = noDirect
	tokens, _ := ids.NewTokens(testTokenKey)
	g.tokens.Store(tokens)
	g.secrets.Store(&clusterdb.Secrets{Internal: testInternalKey, Tokens: [][]byte{testTokenKey}})
	v := &view{Region: clusterdb.Region{ID: 1, Name: "eu"},
		Hosts: []clusterdb.Host{{Slot: 1, Region: 1, State: "active", Addr: strings.TrimPrefix(host.URL, "http://")}}}
	v.index()
	g.view.Store(v)
	gw := httptest.NewServer(g)
	tb.Cleanup(func() { gw.Close(); g.Close() })
	id := ids.NewSandbox(1, 1)
	h := http.Header{}
	h.Set("E2b-Sandbox-Id", id)
	h.Set("E2b-Sandbox-Port", "49999")
	h.Set("X-Access-Token", tokens.Token(id))
	return gw, h
}

// The test gateways' keys: calls to hosts are signed with the first,
// sandbox tokens derive from the second.
var testInternalKey, testTokenKey = ids.RandomKey(), ids.RandomKey()

func (rig *dataPlaneRig) run(tb testing.TB, c *http.Client, base string) {
	req, _ := http.NewRequest(http.MethodPost, base+"/execute", strings.NewReader(`{"code":"1"}`))
	req.Header = rig.headers.Clone()
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("status %d", resp.StatusCode)
	}
}

// BenchmarkDataPlane: a hot run_code-shaped request straight to the
// stand-in host and through the gateway, one at a time over keep-alive
// connections (the difference is the gateway's cost, in process; the
// cluster benchmark measures it against real hosts).
//
//	go test -run '^$' -bench DataPlane -benchmem ./internal/gateway/
func BenchmarkDataPlane(b *testing.B) {
	rig := newDataPlaneRig(b)
	for _, tc := range []struct{ name, base string }{{"direct", rig.host.URL}, {"gateway", rig.gw.URL}} {
		b.Run(tc.name, func(b *testing.B) {
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			defer c.CloseIdleConnections()
			rig.run(b, c, tc.base)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				rig.run(b, c, tc.base)
			}
		})
	}
}
