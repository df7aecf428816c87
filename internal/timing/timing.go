// Package timing records the phases of one operation so that responses can
// explain where their milliseconds went (the Server-Timing header), metrics
// can count them (a histogram per operation and phase) and, when tracing is
// on, each phase becomes a span (a Tracer attached to the Recorder).
package timing

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Recorder collects named phase durations. Safe for concurrent use.
type Recorder struct {
	tracer Tracer // nil: no spans
	mu     sync.Mutex
	phases []phase
}

type phase struct {
	name string
	dur  time.Duration
}

// Tracer turns phases into trace spans (internal/telemetry implements it
// with OpenTelemetry). Implementations must be safe for concurrent use.
type Tracer interface {
	// Phase records a phase that has ended, as a child of ctx's span.
	Phase(ctx context.Context, name string, start, end time.Time)
	// Start begins a phase whose context is passed on to another process
	// (Inject); the returned func ends it.
	Start(ctx context.Context, name string) (context.Context, func())
	// Inject writes ctx's trace context into h (the W3C traceparent).
	Inject(ctx context.Context, h http.Header)
}

type ctxKey struct{}

// With returns a context that carries a new Recorder, and that Recorder.
func With(ctx context.Context) (context.Context, *Recorder) {
	return WithTracer(ctx, nil)
}

// WithTracer is With whose phases also become spans of t (nil: none).
func WithTracer(ctx context.Context, t Tracer) (context.Context, *Recorder) {
	r := &Recorder{tracer: t}
	return context.WithValue(ctx, ctxKey{}, r), r
}

// From returns the Recorder carried by ctx, or nil. Work done on behalf of
// a request carries one; background work (the pool's refill) does not.
func From(ctx context.Context) *Recorder {
	r, _ := ctx.Value(ctxKey{}).(*Recorder)
	return r
}

// Add records a phase that just ended on the context's Recorder, if any.
func Add(ctx context.Context, name string, d time.Duration) {
	if r := From(ctx); r != nil {
		r.Add(name, d)
		if r.tracer != nil {
			end := time.Now()
			r.tracer.Phase(ctx, name, end.Add(-d), end)
		}
	}
}

// Since records the time since start as a phase; use it with defer:
//
//	defer timing.Since(ctx, "netns", time.Now())
func Since(ctx context.Context, name string, start time.Time) {
	if r := From(ctx); r != nil {
		end := time.Now()
		r.Add(name, end.Sub(start))
		if r.tracer != nil {
			r.tracer.Phase(ctx, name, start, end)
		}
	}
}

// Start begins a phase that hands its context on (to the agent: see
// Inject) and returns the context to do it with and the func that ends
// the phase:
//
//	ctx, end := timing.Start(ctx, "init")
//	defer end()
func Start(ctx context.Context, name string) (context.Context, func()) {
	r := From(ctx)
	if r == nil {
		return ctx, func() {}
	}
	start := time.Now()
	if r.tracer == nil {
		return ctx, func() { r.Add(name, time.Since(start)) }
	}
	sctx, end := r.tracer.Start(ctx, name)
	return sctx, func() {
		end()
		r.Add(name, time.Since(start))
	}
}

// Inject writes ctx's trace context into the headers of a request about
// to leave the daemon, when tracing is on.
func Inject(ctx context.Context, h http.Header) {
	if r := From(ctx); r != nil && r.tracer != nil {
		r.tracer.Inject(ctx, h)
	}
}

// Add records a phase. Repeated names are summed.
func (r *Recorder) Add(name string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.phases {
		if r.phases[i].name == name {
			r.phases[i].dur += d
			return
		}
	}
	r.phases = append(r.phases, phase{name, d})
}

// Phases returns the recorded phases in milliseconds.
func (r *Recorder) Phases() map[string]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[string]float64, len(r.phases))
	for _, p := range r.phases {
		m[p.name] = float64(p.dur.Microseconds()) / 1000
	}
	return m
}

// Each calls f for every phase, in the order they were first recorded.
func (r *Recorder) Each(f func(name string, d time.Duration)) {
	r.mu.Lock()
	ps := append([]phase(nil), r.phases...)
	r.mu.Unlock()
	for _, p := range ps {
		f(p.name, p.dur)
	}
}

// Header renders the phases plus a final "total" as a Server-Timing value:
// `netns;dur=1.20, runsc;dur=80.31, total;dur=95.02`.
func (r *Recorder) Header(total time.Duration) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, p := range r.phases {
		fmt.Fprintf(&b, "%s;dur=%.2f, ", p.name, float64(p.dur.Microseconds())/1000)
	}
	fmt.Fprintf(&b, "total;dur=%.2f", float64(total.Microseconds())/1000)
	return b.String()
}
