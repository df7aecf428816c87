// Package samples keeps sandboxes' resource samples (E2B's sandbox
// metrics): CPU, memory and disk, taken every Every and on demand, kept for
// Kept; and reads what their networks refused. It knows a sandbox only as
// what a sample needs of it (Of); the manager adds and forgets sandboxes as
// they come and go.
package samples

import (
	"context"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Samples are taken every Every (E2B's collection bucket) and kept for
// Kept, so that a range asks for history, as E2B's does.
const (
	Every = 5 * time.Second
	Kept  = time.Hour
)

// Of is what a sample needs of a sandbox.
type Of struct {
	ID        string
	Box       *box.Box // nil: none (paused on disk, or gone): no use
	StartedAt time.Time
	CPUCount  int
	MemoryMB  int
	DiskMB    int
}

// History holds every sandbox's samples. Safe for concurrent use.
type History struct {
	boxes *box.Factory
	mu    sync.Mutex
	of    map[string]*series // guarded by mu
}

// series is one sandbox's samples, oldest first, and the CPU it had used
// at the last one.
type series struct {
	samples []sandbox.Metric
	lastCPU time.Duration
	lastAt  time.Time
}

// New returns an empty History that reads boxes' use through boxes.
func New(boxes *box.Factory) *History {
	return &History{boxes: boxes, of: map[string]*series{}}
}

// Add starts sandbox id's history; samples of a sandbox not added are
// dropped.
func (h *History) Add(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.of[id] == nil {
		h.of[id] = &series{}
	}
}

// Forget drops sandbox id's history.
func (h *History) Forget(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.of, id)
}

// Range returns sb's samples between from and to (zero: its start, and
// now), oldest first. When the range reaches now and the last sample is
// older than a fifth of a bucket, a sample is taken now.
func (h *History) Range(ctx context.Context, sb Of, from, to time.Time) ([]sandbox.Metric, error) {
	now := time.Now()
	if to.IsZero() || to.After(now) {
		to = now
	}
	if from.IsZero() {
		from = sb.StartedAt
	}
	h.mu.Lock()
	last := time.Time{}
	if s := h.of[sb.ID]; s != nil && len(s.samples) > 0 {
		last = s.samples[len(s.samples)-1].At
	}
	h.mu.Unlock()
	if !to.Before(now.Add(-Every)) && now.Sub(last) >= Every/5 {
		if err := h.Take(ctx, sb); err != nil {
			return nil, err
		}
		to = time.Now() // the range reaches now: it takes the sample just taken
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := []sandbox.Metric{}
	if s := h.of[sb.ID]; s != nil {
		for _, m := range s.samples {
			if !m.At.Before(from.Truncate(time.Second)) && !m.At.After(to) {
				out = append(out, m)
			}
		}
	}
	return out, nil
}

// Take samples sb now and keeps the sample. CPU use is averaged since the
// previous sample (or since its start); a sandbox without a box uses no
// CPU or memory.
func (h *History) Take(ctx context.Context, sb Of) error {
	m := sandbox.Metric{At: time.Now().UTC(), CPUCount: sb.CPUCount, MemTotal: uint64(sb.MemoryMB) << 20,
		DiskTotal: uint64(sb.DiskMB) << 20}
	var st sandbox.Stats
	if sb.Box != nil {
		var err error
		if st, err = h.boxes.Stats(ctx, sb.Box); err != nil {
			return err
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.of[sb.ID]
	if s == nil {
		return nil // gone meanwhile
	}
	if sb.Box != nil {
		since := s.lastAt
		if since.IsZero() {
			since = sb.StartedAt
		}
		if wall := m.At.Sub(since); wall > 0 && st.CPUUsage >= s.lastCPU {
			m.CPUUsedPct = min(max(100*float64(st.CPUUsage-s.lastCPU)/float64(wall)/float64(sb.CPUCount), 0), 100)
		}
		s.lastCPU, s.lastAt = st.CPUUsage, m.At
		// The root overlay lives in sandbox memory: disk is memory.
		m.MemUsed, m.MemCache, m.DiskUsed = st.MemoryBytes, st.MemoryCache, st.MemoryCache
	}
	s.samples = append(s.samples, m)
	if cut := len(s.samples) - int(Kept/Every); cut > 0 {
		s.samples = append(s.samples[:0:0], s.samples[cut:]...)
	}
	return nil
}

// Run samples the sandboxes running lists every Every until stop is
// closed.
func (h *History) Run(stop <-chan struct{}, running func() []Of) {
	t := time.NewTicker(Every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for _, sb := range running() {
			_ = h.Take(context.Background(), sb)
		}
	}
}

// EgressDenials are a box's refused egress so far, by where it was
// refused.
type EgressDenials struct {
	Firewall uint64 // the router's rules (addresses, ranges, internet off)
	Proxy    uint64 // the domain-rule proxy (a name no rule allows)
	DNS      uint64 // the resolver (REFUSED: a name no rule allows)
}

// deniedByReason is what a network that tells refusals apart offers
// (netns does); others count them all as the firewall's.
type deniedByReason interface {
	DeniedByReason() (firewall, proxy, dns uint64, err error)
}

// Egress reads the refusal counts of a box's network from the kernel:
// call it from a background sampler, not on a request's path. An error
// means the network is gone.
func Egress(n sandbox.Net) (EgressDenials, error) {
	var d EgressDenials
	var err error
	if dr, ok := n.(deniedByReason); ok {
		d.Firewall, d.Proxy, d.DNS, err = dr.DeniedByReason()
	} else {
		d.Firewall, err = n.Denied()
	}
	return d, err
}
