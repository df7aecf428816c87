package integration

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an in-process OTLP/HTTP trace receiver: what a daemon with
// --tracing exports lands here.
type collector struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			c.spans = append(c.spans, ss.Spans...)
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// trace returns the spans of traceID received so far.
func (c *collector) trace(traceID string) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if hex.EncodeToString(s.TraceId) == traceID {
			out = append(out, s)
		}
	}
	return out
}

// traceparent starts a trace as a client would: a random trace id and
// the id of the client's own span.
func traceparent() (header, traceID, parentID string) {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	traceID, parentID = hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])
	return "00-" + traceID + "-" + parentID + "-01", traceID, parentID
}

// tree is one trace's spans by id, with their children.
type tree struct {
	byID     map[string]*tracepb.Span
	children map[string][]*tracepb.Span
}

func newTree(spans []*tracepb.Span) tree {
	tr := tree{byID: map[string]*tracepb.Span{}, children: map[string][]*tracepb.Span{}}
	for _, s := range spans {
		tr.byID[hex.EncodeToString(s.SpanId)] = s
		p := hex.EncodeToString(s.ParentSpanId)
		tr.children[p] = append(tr.children[p], s)
	}
	return tr
}

func (tr tree) childNames(id string) []string {
	var names []string
	for _, s := range tr.children[id] {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	return names
}

// checkTree checks the trace of one request: a single server span named
// route under the client's span, whose descendants are every other span
// of the trace, each inside its parent's interval, and among whose
// children are want. It returns the server span.
func checkTree(t *testing.T, c *collector, traceID, parentID, route string, want ...string) (tree, *tracepb.Span) {
	t.Helper()
	var spans []*tracepb.Span
	eventually(t, 15*time.Second, "the spans of "+route, func() bool {
		spans = c.trace(traceID)
		tr := newTree(spans)
		roots := tr.children[parentID]
		if len(roots) != 1 {
			return false
		}
		got := tr.childNames(hex.EncodeToString(roots[0].SpanId))
		for _, w := range want {
			if !contains(got, w) {
				return false
			}
		}
		return true
	})
	tr := newTree(spans)
	root := tr.children[parentID][0]
	if root.Name != route || root.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("root span %q (kind %v), want server span %q", root.Name, root.Kind, route)
	}
	// Every span descends from the root and lies within its parent.
	for _, s := range spans {
		if s == root {
			continue
		}
		p, ok := tr.byID[hex.EncodeToString(s.ParentSpanId)]
		if !ok {
			t.Errorf("span %q has a parent outside the trace", s.Name)
			continue
		}
		const slack = uint64(time.Millisecond)
		if s.StartTimeUnixNano+slack < p.StartTimeUnixNano || s.EndTimeUnixNano > p.EndTimeUnixNano+slack {
			t.Errorf("span %q [%d, %d] is not within its parent %q [%d, %d]", s.Name,
				s.StartTimeUnixNano, s.EndTimeUnixNano, p.Name, p.StartTimeUnixNano, p.EndTimeUnixNano)
		}
	}
	t.Logf("%s: %s", route, strings.Join(tr.childNames(hex.EncodeToString(root.SpanId)), ", "))
	return tr, root
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func attr(s *tracepb.Span, key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value.GetStringValue()
		}
	}
	return ""
}

// TestTraces: a daemon with --tracing exports, over OTLP/HTTP to an
// in-process collector, the span tree of a create, a fork and a run_code,
// each continuing the client's traceparent; run_code's code sees the
// traceparent of the daemon's upstream span (the agent got it).
func TestTraces(t *testing.T) {
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_SERVICE_NAME=cellfork-itest"}
	// No pool: the create restores (its phases are the interesting ones).
	withDaemonEnv(t, env, []string{"--tracing", "--pool-ready", "0", "--pool-shells", "0", "--standby-snapshots", "0"}, func() {
		key := map[string]string{"X-API-KEY": apiKey}
		tp, traceID, parentID := traceparent()
		r := callWith(t, "POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, map[string]string{"X-API-KEY": apiKey, "traceparent": tp})
		if r.status != http.StatusCreated {
			t.Fatalf("create: %d %s", r.status, r.body)
		}
		var sb sandboxInfo
		r.json(t, &sb)
		defer killQuietly(sb.SandboxID)
		_, root := checkTree(t, col, traceID, parentID, "POST /v2/sandboxes", "resolve", "restore", "agent", "init")
		if attr(root, "cellfork.sandbox.id") != "" {
			t.Error("create's span names a sandbox before there is one")
		}
		if attr(root, "cellfork.operation") != "create" {
			t.Errorf("create's span has operation %q", attr(root, "cellfork.operation"))
		}

		tp, traceID, parentID = traceparent()
		r = callWith(t, "POST", "/sandboxes/"+sb.SandboxID+"/fork", map[string]any{"count": 1}, map[string]string{"X-API-KEY": apiKey, "traceparent": tp})
		if r.status != http.StatusCreated {
			t.Fatalf("fork: %d %s", r.status, r.body)
		}
		var kids []struct {
			Sandbox *sandboxInfo `json:"sandbox"`
		}
		r.json(t, &kids)
		for _, k := range kids {
			if k.Sandbox != nil {
				defer killQuietly(k.Sandbox.SandboxID)
			}
		}
		_, root = checkTree(t, col, traceID, parentID, "POST /sandboxes/{id}/fork", "checkpoint", "restore", "init")
		if attr(root, "cellfork.sandbox.id") != sb.SandboxID {
			t.Errorf("fork's span names sandbox %q, want %s", attr(root, "cellfork.sandbox.id"), sb.SandboxID)
		}

		tp, traceID, parentID = traceparent()
		h := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49999", "X-Access-Token": sb.EnvdAccessToken,
			"Content-Type": "application/json", "traceparent": tp}
		r = dataCall(t, "POST", "/execute", h, strings.NewReader(`{"code": "import os; print(os.environ['TRACEPARENT'])"}`))
		if r.status != http.StatusOK {
			t.Fatalf("execute: %d %s", r.status, r.body)
		}
		tr, _ := checkTree(t, col, traceID, parentID, "POST /execute", "route", "upstream")
		var upstream *tracepb.Span
		for _, s := range tr.byID {
			if s.Name == "upstream" {
				upstream = s
			}
		}
		want := fmt.Sprintf("00-%s-%s-01", traceID, hex.EncodeToString(upstream.SpanId))
		if !bytes.Contains(r.body, []byte(want)) {
			t.Errorf("the code saw no TRACEPARENT %s (the daemon's upstream span): %s", want, r.body)
		}

		// The same daemon's metrics saw the same operations.
		m := callWith(t, "GET", "/metrics", nil, key)
		for _, line := range []string{
			`cellfork_sandbox_creates_total{boot_mode="restore",template="base"} 1`,
			`cellfork_sandbox_creates_total{boot_mode="fork",template="base"} 1`,
			`cellfork_checkpoints_total{kind="fork",trigger="request"} 1`,
			`cellfork_restores_total{source="fork",trigger="request"} 1`,
			`cellfork_requests_total{code="200",operation="run_code"} 1`,
			`cellfork_operation_duration_seconds_count{operation="create",phase="restore"} 1`,
			`cellfork_operation_duration_seconds_count{operation="fork",phase="checkpoint"} 1`,
			`cellfork_sandboxes{state="running",template="base"} 2`,
		} {
			if !bytes.Contains(m.body, []byte(line+"\n")) {
				t.Errorf("/metrics lacks %q", line)
			}
		}
	})
}

// TestMetricsAuth: /metrics needs the API key (header or bearer) on the
// API's port, and none on --metrics-addr; a sandbox id never appears in
// it.
func TestMetricsAuth(t *testing.T) {
	sb := create(t, nil)
	runCode(t, sb, "1")
	if r := callWith(t, "GET", "/metrics", nil, nil); r.status != http.StatusUnauthorized {
		t.Errorf("/metrics without a key: %d", r.status)
	}
	if r := callWith(t, "GET", "/metrics", nil, map[string]string{"Authorization": "Bearer wrong"}); r.status != http.StatusUnauthorized {
		t.Errorf("/metrics with a wrong bearer key: %d", r.status)
	}
	r := callWith(t, "GET", "/metrics", nil, map[string]string{"Authorization": "Bearer " + apiKey})
	if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics with the bearer key: %d %s", r.status, r.header.Get("Content-Type"))
	}
	for _, want := range []string{"cellfork_auth_failures_total{reason=\"invalid_key\"}", "cellfork_pool_ready{template=\"base\"}",
		"cellfork_host_memory_bytes", "cellfork_requests_in_flight{plane=\"control\"} 1"} {
		if !bytes.Contains(r.body, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if bytes.Contains(r.body, []byte(sb.SandboxID)) {
		t.Error("/metrics carries a sandbox id")
	}
	// The bearer form is for /metrics only.
	if r := callWith(t, "GET", "/v2/sandboxes", nil, map[string]string{"Authorization": "Bearer " + apiKey}); r.status != http.StatusUnauthorized {
		t.Errorf("a bearer key on the API: %d", r.status)
	}
	var host struct {
		Sandboxes map[string]int `json:"sandboxes"`
		Pool      struct {
			ReadyTarget int `json:"readyTarget"`
		} `json:"pool"`
	}
	call(t, "GET", "/host", nil).json(t, &host)
	if host.Sandboxes["running"] < 1 || host.Pool.ReadyTarget != 1 {
		t.Errorf("/host: %+v", host)
	}

	addr := freeAddr()
	withDaemon(t, []string{"--metrics-addr", addr, "--pool-ready", "0", "--pool-shells", "0"}, func() {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("cellfork_build_info")) {
			t.Errorf("--metrics-addr: %d %.200s", resp.StatusCode, body)
		}
		if resp, err := http.Get("http://" + addr + "/v2/sandboxes"); err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("--metrics-addr serves the API: %d", resp.StatusCode)
			}
		}
	})
}
