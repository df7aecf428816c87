package timing

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestHeader(t *testing.T) {
	ctx, r := With(context.Background())
	Add(ctx, "netns", 1500*time.Microsecond)
	Add(ctx, "runsc", 80*time.Millisecond)
	Add(ctx, "netns", 500*time.Microsecond) // repeated names add up
	Add(context.Background(), "ignored", time.Second)
	got := r.Header(100 * time.Millisecond)
	if got != "netns;dur=2.00, runsc;dur=80.00, total;dur=100.00" {
		t.Fatalf("header %q", got)
	}
	if p := r.Phases(); p["netns"] != 2 || len(p) != 2 {
		t.Fatalf("phases %v", p)
	}
	if From(context.Background()) != nil || !strings.Contains(got, "total") {
		t.Fatal("no recorder expected")
	}
}

// fakeTracer records what the Recorder tells it.
type fakeTracer struct {
	phases  []string
	started []string
	ended   int
}

func (f *fakeTracer) Phase(_ context.Context, name string, start, end time.Time) {
	if end.Before(start) {
		panic("phase ends before it starts")
	}
	f.phases = append(f.phases, name)
}

func (f *fakeTracer) Start(ctx context.Context, name string) (context.Context, func()) {
	f.started = append(f.started, name)
	return context.WithValue(ctx, fakeSpan{}, name), func() { f.ended++ }
}

type fakeSpan struct{}

func (f *fakeTracer) Inject(ctx context.Context, h http.Header) {
	h.Set("traceparent", ctx.Value(fakeSpan{}).(string))
}

func TestTracer(t *testing.T) {
	ft := &fakeTracer{}
	ctx, r := WithTracer(context.Background(), ft)
	Add(ctx, "netns", time.Millisecond)
	Since(ctx, "restore", time.Now().Add(-2*time.Millisecond))
	sctx, end := Start(ctx, "init")
	h := http.Header{}
	Inject(sctx, h)
	end()
	if h.Get("traceparent") != "init" {
		t.Fatalf("inject wrote %q, want the started phase's context", h.Get("traceparent"))
	}
	if len(ft.phases) != 2 || ft.phases[0] != "netns" || ft.phases[1] != "restore" || ft.ended != 1 {
		t.Fatalf("tracer saw phases %v, ended %d", ft.phases, ft.ended)
	}
	var names []string
	r.Each(func(name string, d time.Duration) { names = append(names, name) })
	if strings.Join(names, ",") != "netns,restore,init" {
		t.Fatalf("recorded %v", names)
	}
	// Without a recorder nothing happens; without a tracer phases are still timed.
	_, end = Start(context.Background(), "x")
	end()
	ctx, r = With(context.Background())
	_, end = Start(ctx, "init")
	Inject(ctx, h)
	end()
	if _, ok := r.Phases()["init"]; !ok {
		t.Fatal("Start without a tracer did not record its phase")
	}
}
