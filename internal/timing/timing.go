// Package timing records the phases of one operation so that responses can
// explain where their milliseconds went (the Server-Timing header).
package timing

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Recorder collects named phase durations. Safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	phases []phase
}

type phase struct {
	name string
	dur  time.Duration
}

type ctxKey struct{}

// With returns a context that carries a new Recorder, and that Recorder.
func With(ctx context.Context) (context.Context, *Recorder) {
	r := &Recorder{}
	return context.WithValue(ctx, ctxKey{}, r), r
}

// From returns the Recorder carried by ctx, or nil.
func From(ctx context.Context) *Recorder {
	r, _ := ctx.Value(ctxKey{}).(*Recorder)
	return r
}

// Add records a phase on the context's Recorder, if any.
func Add(ctx context.Context, name string, d time.Duration) {
	if r := From(ctx); r != nil {
		r.Add(name, d)
	}
}

// Since records the time since start as a phase; use it with defer:
//
//	defer timing.Since(ctx, "netns", time.Now())
func Since(ctx context.Context, name string, start time.Time) {
	Add(ctx, name, time.Since(start))
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

// Phases returns the recorded phases in milliseconds, in insertion order.
func (r *Recorder) Phases() map[string]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[string]float64, len(r.phases))
	for _, p := range r.phases {
		m[p.name] = float64(p.dur.Microseconds()) / 1000
	}
	return m
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
