package integration

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/cellfork/cellfork/internal/telemetry/otlptest"
)

// checkTree checks the trace of one request: a single server span named
// route under the client's span, whose descendants are every other span
// of the trace, each inside its parent's interval, and among whose
// children are want. It returns the server span.
func checkTree(t *testing.T, c *otlptest.Collector, traceID, parentID, route string, want ...string) (otlptest.Tree, *tracepb.Span) {
	t.Helper()
	var tr otlptest.Tree
	eventually(t, 15*time.Second, "the spans of "+route, func() bool {
		tr = otlptest.NewTree(c.Trace(traceID))
		roots := tr.Children[parentID]
		return len(roots) == 1 && tr.HasChildren(otlptest.ID(roots[0]), want...)
	})
	root := tr.Children[parentID][0]
	if root.Name != route || root.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("root span %q (kind %v), want server span %q", root.Name, root.Kind, route)
	}
	for _, bad := range tr.Nesting(root) {
		t.Error(bad)
	}
	t.Logf("%s: %s", route, strings.Join(tr.ChildNames(otlptest.ID(root)), ", "))
	return tr, root
}

// TestTraces: a daemon with --tracing exports, over OTLP/HTTP to an
// in-process collector, the span tree of a create, a fork and a run_code,
// each continuing the client's traceparent; run_code's code sees the
// traceparent of the daemon's upstream span (the agent got it).
func TestTraces(t *testing.T) {
	col := &otlptest.Collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_SERVICE_NAME=cellfork-itest"}
	// No pool: the create restores (its phases are the interesting ones).
	withDaemonEnv(t, env, []string{"--tracing", "--pool-ready", "0", "--pool-shells", "0", "--standby-snapshots", "0"}, func() {
		key := map[string]string{"X-API-KEY": apiKey}
		tp, traceID, parentID := otlptest.Traceparent()
		r := callWith(t, "POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, map[string]string{"X-API-KEY": apiKey, "traceparent": tp})
		if r.status != http.StatusCreated {
			t.Fatalf("create: %d %s", r.status, r.body)
		}
		var sb sandboxInfo
		r.json(t, &sb)
		defer killQuietly(sb.SandboxID)
		_, root := checkTree(t, col, traceID, parentID, "POST /v2/sandboxes", "resolve", "restore", "agent", "init")
		if otlptest.Attr(root, "cellfork.sandbox.id") != "" {
			t.Error("create's span names a sandbox before there is one")
		}
		if otlptest.Attr(root, "cellfork.operation") != "create" {
			t.Errorf("create's span has operation %q", otlptest.Attr(root, "cellfork.operation"))
		}

		tp, traceID, parentID = otlptest.Traceparent()
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
		if otlptest.Attr(root, "cellfork.sandbox.id") != sb.SandboxID {
			t.Errorf("fork's span names sandbox %q, want %s", otlptest.Attr(root, "cellfork.sandbox.id"), sb.SandboxID)
		}

		tp, traceID, parentID = otlptest.Traceparent()
		h := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49999", "X-Access-Token": sb.EnvdAccessToken,
			"Content-Type": "application/json", "traceparent": tp}
		r = dataCall(t, "POST", "/execute", h, strings.NewReader(`{"code": "import os; print(os.environ['TRACEPARENT'])"}`))
		if r.status != http.StatusOK {
			t.Fatalf("execute: %d %s", r.status, r.body)
		}
		tr, root := checkTree(t, col, traceID, parentID, "POST /execute", "route", "upstream")
		upstream := tr.Child(otlptest.ID(root), "upstream")
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
