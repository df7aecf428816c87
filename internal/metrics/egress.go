package metrics

import (
	"context"
	"time"
)

// EgressCounts are one box's refused egress so far.
type EgressCounts struct {
	Firewall, Proxy, DNS uint64
}

// EgressReader returns the refusal counts of every running box, keyed by
// something that stays the same for a box's life (its runtime id).
type EgressReader func(ctx context.Context) map[string]EgressCounts

// SampleEgress adds what read's counts grew by to
// cellfork_egress_denied_total every interval, until ctx ends. Reading
// every box's counters from the kernel takes too long for a scrape, so
// it happens here, in the background; refusals of a box in its last
// interval before it went away are not counted.
func (h *Host) SampleEgress(ctx context.Context, interval time.Duration, read EgressReader) {
	t := time.NewTicker(interval)
	defer t.Stop()
	prev := read(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := read(ctx)
		h.addEgress(prev, cur)
		prev = cur
	}
}

// addEgress counts how far cur grew past prev. A box first seen in cur
// counts from zero: it came up since the last sample.
func (h *Host) addEgress(prev, cur map[string]EgressCounts) {
	var fw, proxy, dns uint64
	grow := func(now, before uint64) uint64 {
		if now < before { // cannot happen for one box; be safe
			return now
		}
		return now - before
	}
	for k, c := range cur {
		p := prev[k]
		fw += grow(c.Firewall, p.Firewall)
		proxy += grow(c.Proxy, p.Proxy)
		dns += grow(c.DNS, p.DNS)
	}
	h.egressDenied.WithLabelValues("firewall").Add(float64(fw))
	h.egressDenied.WithLabelValues("proxy").Add(float64(proxy))
	h.egressDenied.WithLabelValues("dns").Add(float64(dns))
}
