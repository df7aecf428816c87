package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cellfork/cellfork/internal/timing"
)

func TestOff(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	tr, err := New(context.Background(), Config{})
	if err != nil || tr != nil {
		t.Fatalf("tracing on by default: %v %v", tr, err)
	}
	// A nil Tracing is safe to use.
	ctx, q := tr.StartRequest(httptest.NewRequest(http.MethodGet, "/", nil))
	q.Finish("GET /", "x", "", 200)
	if tr.Phases() != nil || trace.SpanFromContext(ctx).SpanContext().IsValid() || tr.Shutdown(ctx) != nil {
		t.Fatal("a nil Tracing traced")
	}
	for _, c := range []struct {
		env  map[string]string
		cfg  Config
		want bool
	}{
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, Config{}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none"}, Config{Enabled: true}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true"}, Config{Enabled: true}, false},
		{nil, Config{Enabled: true}, true},
	} {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		if got := c.cfg.On(); got != c.want {
			t.Errorf("env %v, %+v: on %v, want %v", c.env, c.cfg, got, c.want)
		}
		for k := range c.env {
			t.Setenv(k, "")
		}
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	if _, err := New(context.Background(), Config{Enabled: true}); err == nil {
		t.Error("grpc accepted")
	}
}

// TestTree: a request span continues the caller's traceparent; phases
// are its children with their own times; a started phase is what Inject
// passes on.
func TestTree(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := New(context.Background(), Config{Exporter: exp, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/sandboxes/abc/fork", nil)
	r.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	ctx, q := tr.StartRequest(r)
	ctx, _ = timing.WithTracer(ctx, tr.Phases())
	timing.Since(ctx, "checkpoint", time.Now().Add(-30*time.Millisecond))
	uctx, end := timing.Start(ctx, "upstream")
	h := http.Header{}
	timing.Inject(uctx, h)
	end()
	q.Finish("POST /sandboxes/{id}/fork", "fork", "abc", 503)
	if err := tr.tp.ForceFlush(context.Background()); err != nil { // Shutdown would clear the exporter
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	byName := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	root, ok := byName["POST /sandboxes/{id}/fork"]
	if !ok || root.Parent.SpanID().String() != "b7ad6b7169203331" || root.SpanContext.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("root %+v does not continue the caller's trace", root)
	}
	if root.Status.Code.String() != "Error" || root.SpanKind != trace.SpanKindServer {
		t.Errorf("root status %v kind %v", root.Status, root.SpanKind)
	}
	cp, up := byName["checkpoint"], byName["upstream"]
	for _, s := range []tracetest.SpanStub{cp, up} {
		if s.Parent.SpanID() != root.SpanContext.SpanID() {
			t.Errorf("%s is not a child of the request", s.Name)
		}
	}
	if d := cp.EndTime.Sub(cp.StartTime); d < 30*time.Millisecond {
		t.Errorf("checkpoint lasted %v, want its own 30 ms", d)
	}
	if want := "00-0af7651916cd43dd8448eb211c80319c-" + up.SpanContext.SpanID().String() + "-01"; h.Get("traceparent") != want {
		t.Errorf("injected %q, want %q", h.Get("traceparent"), want)
	}
}
