package cluster

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/cellfork/cellfork/internal/telemetry/otlptest"
)

// hop is what one trace should hold: the gateway's span of the request
// (route) with children want, and under its child via (the call to the
// host) the host's span (hostRoute) with children hostWant.
type hop struct {
	route      string
	want       []string
	via        string
	hostRoute  string
	hostWant   []string
	gw, hostSp *tracepb.Span
	tree       otlptest.Tree
}

// check waits for the trace of a request that carried a traceparent of
// traceID and the client's span parentID to take hp's shape, then checks
// that it is one tree, nested in time.
func (hp *hop) check(t *testing.T, traceID, parentID string) {
	t.Helper()
	shaped := func() bool {
		hp.tree = otlptest.NewTree(traces.Trace(traceID))
		roots := hp.tree.Children[parentID]
		if len(roots) != 1 || !hp.tree.HasChildren(otlptest.ID(roots[0]), hp.want...) {
			return false
		}
		hp.gw = roots[0]
		call := hp.tree.Child(otlptest.ID(hp.gw), hp.via)
		if call == nil {
			return false
		}
		hp.hostSp = hp.tree.Child(otlptest.ID(call), hp.hostRoute)
		return hp.hostSp != nil && hp.tree.HasChildren(otlptest.ID(hp.hostSp), hp.hostWant...)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !shaped() {
		if time.Now().After(deadline) {
			var got []string
			for _, s := range traces.Trace(traceID) {
				got = append(got, fmt.Sprintf("%s(%x<-%x)", s.Name, s.SpanId, s.ParentSpanId))
			}
			t.Fatalf("the trace of %s is not gateway %q {%s} -> %s -> host %q {%s}; it has: %s", hp.route, hp.route,
				strings.Join(hp.want, " "), hp.via, hp.hostRoute, strings.Join(hp.hostWant, " "), strings.Join(got, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if hp.gw.Name != hp.route || hp.gw.Kind != tracepb.Span_SPAN_KIND_SERVER || hp.hostSp.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("gateway span %q (%v), host span %q (%v): want server spans", hp.gw.Name, hp.gw.Kind, hp.hostSp.Name, hp.hostSp.Kind)
	}
	for _, bad := range hp.tree.Nesting(hp.gw) {
		t.Error(bad)
	}
	t.Logf("%s: gateway {%s}, host {%s}", hp.route, strings.Join(hp.tree.ChildNames(otlptest.ID(hp.gw)), " "),
		strings.Join(hp.tree.ChildNames(otlptest.ID(hp.hostSp)), " "))
}

// testTraces: a create, a fork and a run_code through a gateway, each
// with the client's traceparent, are each one trace: the gateway's
// request span, its phases, and under its call to the host the host's
// request span with the host's phases; run_code's code sees the
// traceparent of the host's upstream span (the agent got it). The
// hosts and gateways trace only sampled requests (the harness's
// sampler), so this test's are the suite's only traces.
func testTraces(t *testing.T) {
	tp, traceID, parentID := otlptest.Traceparent()
	r := do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 120}, map[string]string{"traceparent": tp})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var sb sandbox
	r.json(t, &sb)
	t.Cleanup(func() { do(t, "eu", "DELETE", "/sandboxes/"+sb.ID, nil, nil) })
	create := &hop{route: "POST /v2/sandboxes", want: []string{"auth", "route", "place", "reserve", "host"},
		via: "host", hostRoute: "POST /v2/sandboxes", hostWant: []string{"resolve", "restore", "agent", "init"}}
	create.check(t, traceID, parentID)

	tp, traceID, parentID = otlptest.Traceparent()
	r = do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/fork", map[string]any{"count": 1}, map[string]string{"traceparent": tp})
	if r.status != http.StatusCreated {
		t.Fatalf("fork: %d %s", r.status, r.body)
	}
	var kids []struct {
		Sandbox *sandbox `json:"sandbox"`
	}
	r.json(t, &kids)
	for _, k := range kids {
		if k.Sandbox != nil {
			t.Cleanup(func() { do(t, "eu", "DELETE", "/sandboxes/"+k.Sandbox.ID, nil, nil) })
		}
	}
	if len(kids) != 1 || kids[0].Sandbox == nil {
		t.Fatalf("fork: %s", r.body)
	}
	fork := &hop{route: "POST /sandboxes/{id}/fork", want: []string{"auth", "route", "upstream"},
		via: "upstream", hostRoute: "POST /sandboxes/{id}/fork", hostWant: []string{"checkpoint", "restore", "init"}}
	fork.check(t, traceID, parentID)
	if got := otlptest.Attr(fork.hostSp, "cellfork.sandbox.id"); got != sb.ID {
		t.Errorf("the host's fork span names sandbox %q, want %s", got, sb.ID)
	}

	tp, traceID, parentID = otlptest.Traceparent()
	out, status := runCodeWith(t, "eu", sb, "import os; print(os.environ['TRACEPARENT'])", map[string]string{"traceparent": tp})
	if status != http.StatusOK {
		t.Fatalf("run_code: %d %s", status, out)
	}
	run := &hop{route: "POST /execute", want: []string{"route", "upstream"},
		via: "upstream", hostRoute: "POST /execute", hostWant: []string{"route", "upstream"}}
	run.check(t, traceID, parentID)
	if got := otlptest.Attr(run.gw, "cellfork.sandbox.id"); got != sb.ID {
		t.Errorf("the gateway's run_code span names sandbox %q, want %s", got, sb.ID)
	}
	upstream := run.tree.Child(otlptest.ID(run.hostSp), "upstream")
	if want := fmt.Sprintf("00-%s-%s-01", traceID, otlptest.ID(upstream)); strings.TrimSpace(out) != want {
		t.Errorf("the code saw TRACEPARENT %q, want %s (the host's upstream span)", out, want)
	}

	// Without a traceparent nothing is traced (the sampler follows the
	// client's choice).
	time.Sleep(300 * time.Millisecond) // the last of the traced requests' spans
	before := traces.Count()
	if out, _ := runCode(t, "eu", sb, "print(1)"); out != "1\n" {
		t.Errorf("run_code without a traceparent: %q", out)
	}
	time.Sleep(500 * time.Millisecond) // past the exporters' batching delay
	if after := traces.Count(); after != before {
		t.Errorf("an untraced request made %d spans", after-before)
	}
}
