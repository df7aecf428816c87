// Package placement chooses hosts for new sandboxes, in memory, from the
// host table a gateway keeps. A decision costs the same at 10 hosts and at
// 10,000: hosts are indexed per region (and per template with a ready
// pool) when the table changes, and a placement samples a few of them
// (best of K, which also keeps gateways that place at once from all
// choosing the same host), scanning a whole region only when sampling
// finds too few, which is also when it says why nothing fits.
//
// The choice is a proposal: the gateway reserves the host's memory with a
// conditional update in the cluster database and, if another gateway took
// it first, tries the next candidate.
package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/clusterdb"
)

// Request is what a new sandbox needs.
type Request struct {
	Region   int
	MemoryMB int64
	Template string // a built-in template or a custom template's build: a host with a ready pool of it first
	// Slot, if not 0, is the one host that can run it (a snapshot's image
	// that is only on its host). Home, if not 0, is the host that holds
	// the image on disk, first when it can take it; others fetch the image
	// from the chunk store (Versions say which may).
	Slot     int
	Home     int
	Standby  string   // a snapshot: its standby's host first
	Versions []string // "runsc=...": the host must have these
	Features []string // CPU features the image needs
	Exclude  map[int]bool
}

// Reserve is memory kept free on every host (MiB).
const Reserve = 256

// MaxQueue is the start queue past which a host gets no more sandboxes.
const MaxQueue = 32

// K is how many eligible hosts a placement compares.
const K = 3

// Table is an immutable view of the hosts, indexed for placement.
type Table struct {
	now      time.Time
	all      []clusterdb.Host
	byRegion map[int][]int            // region -> indexes into all
	ready    map[int]map[string][]int // region -> template -> hosts with a ready pool
	bySlot   map[int]int
}

// NewTable indexes hosts as of now.
func NewTable(hosts []clusterdb.Host, now time.Time) *Table {
	t := &Table{now: now, all: hosts, byRegion: map[int][]int{}, ready: map[int]map[string][]int{}, bySlot: map[int]int{}}
	for i, h := range hosts {
		t.bySlot[h.Slot] = i
		t.byRegion[h.Region] = append(t.byRegion[h.Region], i)
		for tpl, n := range h.Capacity.Ready {
			if n > 0 {
				if t.ready[h.Region] == nil {
					t.ready[h.Region] = map[string][]int{}
				}
				t.ready[h.Region][tpl] = append(t.ready[h.Region][tpl], i)
			}
		}
	}
	return t
}

// Host returns the host of slot.
func (t *Table) Host(slot int) (clusterdb.Host, bool) {
	i, ok := t.bySlot[slot]
	if !ok {
		return clusterdb.Host{}, false
	}
	return t.all[i], true
}

// Len is the number of hosts.
func (t *Table) Len() int { return len(t.all) }

// Reasons counts why hosts were passed over, by reason.
type Reasons map[string]int

// Capacity reports whether only capacity is missing (so the caller may
// retry later: 503 with Retry-After).
func (r Reasons) Capacity() bool {
	for k, n := range r {
		if n > 0 && k != reasonMemory && k != reasonQueue && k != reasonTried {
			return false
		}
	}
	return true
}

func (r Reasons) String() string {
	if len(r) == 0 {
		return "no host in the region"
	}
	keys := make([]string, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r[keys[i]] > r[keys[j]] || r[keys[i]] == r[keys[j]] && keys[i] < keys[j] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		word := "hosts"
		if r[k] == 1 {
			word = "host"
		}
		parts[i] = fmt.Sprintf("%d %s %s", r[k], word, k)
	}
	return strings.Join(parts, ", ")
}

const (
	reasonLost     = "lost"
	reasonSilent   = "not heartbeating"
	reasonMemory   = "out of memory"
	reasonQueue    = "with a full start queue"
	reasonTried    = "already tried"
	reasonVersion  = "of another runsc build"
	reasonFeatures = "lacking CPU features"
)

// why returns why h cannot take req ("" if it can).
func (t *Table) why(h *clusterdb.Host, req *Request) string {
	switch {
	case req.Exclude[h.Slot]:
		return reasonTried
	case h.State == "lost":
		return reasonLost
	case h.State != "active":
		return h.State
	case h.LeaseUntil.Before(t.now):
		return reasonSilent
	case h.MemAllocMB+req.MemoryMB > h.MemTotalMB-Reserve:
		return reasonMemory
	case h.StartQueue >= MaxQueue:
		return reasonQueue
	}
	for _, v := range req.Versions {
		k, val, _ := strings.Cut(v, "=")
		if h.Versions[k] != val {
			return reasonVersion
		}
	}
	for _, f := range req.Features {
		if !slices.Contains(h.CPUFeatures, f) {
			if len(req.Features) == 1 {
				return "lacking " + f
			}
			return reasonFeatures
		}
	}
	return ""
}

// score orders eligible hosts: lower is better. Load is the share of
// memory and the start queue; a ready pool of the template or the
// snapshot's standby is worth most.
func score(h *clusterdb.Host, req *Request) float64 {
	s := float64(h.MemAllocMB+req.MemoryMB)/float64(max(h.MemTotalMB, 1)) + 0.05*float64(h.StartQueue)
	if req.Template != "" && h.Capacity.Ready[req.Template] > 0 {
		s -= 1
	}
	if req.Standby != "" && slices.Contains(h.Capacity.Standbys, req.Standby) {
		s -= 2
	}
	return s
}

// Choose returns the hosts to try for req, best first (at most a few),
// and, when there are none, why.
func (t *Table) Choose(req Request, rng *rand.Rand) ([]clusterdb.Host, Reasons) {
	if req.Slot != 0 {
		h, ok := t.Host(req.Slot)
		if !ok {
			return nil, Reasons{"holding its image is not in the cluster": 1}
		}
		if why := t.why(&h, &req); why != "" {
			return nil, Reasons{"holding its image is " + why: 1}
		}
		return []clusterdb.Host{h}, nil
	}
	pick := func(pool []int, budget int) []int {
		var got []int
		for i := 0; i < budget && len(got) < K && len(pool) > 0; i++ {
			j := pool[rng.IntN(len(pool))]
			if !slices.Contains(got, j) && t.why(&t.all[j], &req) == "" {
				got = append(got, j)
			}
		}
		return got
	}
	var got []int
	if req.Template != "" {
		got = pick(t.ready[req.Region][req.Template], 2*K)
	}
	if len(got) < K {
		for _, j := range pick(t.byRegion[req.Region], 4*K) {
			if !slices.Contains(got, j) {
				got = append(got, j)
			}
		}
	}
	var reasons Reasons
	if len(got) == 0 {
		// Sampling found nothing: look at every host, and say why.
		reasons = Reasons{}
		for _, j := range t.byRegion[req.Region] {
			if why := t.why(&t.all[j], &req); why != "" {
				reasons[why]++
			} else {
				got = append(got, j)
			}
		}
		if len(got) == 0 {
			return nil, reasons
		}
		rng.Shuffle(len(got), func(a, b int) { got[a], got[b] = got[b], got[a] })
		got = got[:min(len(got), 2*K)]
	}
	out := make([]clusterdb.Host, len(got))
	for i, j := range got {
		out[i] = t.all[j]
	}
	sort.SliceStable(out, func(a, b int) bool { return score(&out[a], &req) < score(&out[b], &req) })
	if h, ok := t.Host(req.Home); ok && h.Region == req.Region && t.why(&h, &req) == "" {
		out = slices.DeleteFunc(out, func(o clusterdb.Host) bool { return o.Slot == h.Slot })
		out = append([]clusterdb.Host{h}, out...)
	}
	return out, nil
}
