package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/clusterdb"
)

func host(slot, region int, memTotal, memAlloc int64) clusterdb.Host {
	return clusterdb.Host{Slot: slot, Region: region, State: "active", LeaseUntil: time.Now().Add(time.Minute),
		MemTotalMB: memTotal, MemAllocMB: memAlloc, Versions: map[string]string{"runsc": "v1"},
		CPUFeatures: []string{"sse4_2", "avx2"}}
}

func TestChooseFiltersAndSaysWhy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	draining := host(2, 1, 8192, 0)
	draining.State = "draining"
	cordoned := host(3, 1, 8192, 0)
	cordoned.State = "draining"
	full := host(4, 1, 2048, 1900)
	silent := host(5, 1, 8192, 0)
	silent.LeaseUntil = time.Now().Add(-time.Second)
	noAVX := host(6, 1, 8192, 0)
	noAVX.CPUFeatures = []string{"sse4_2"}
	tbl := NewTable([]clusterdb.Host{draining, cordoned, full, silent, noAVX, host(7, 2, 8192, 0)}, time.Now())
	got, why := tbl.Choose(Request{Region: 1, MemoryMB: 1024, Features: []string{"avx512f"}}, rng)
	if len(got) != 0 {
		t.Fatalf("placed on %v", got)
	}
	// Each host counts once, under the first reason met.
	if s := why.String(); s != "2 hosts draining, 1 host lacking avx512f, 1 host not heartbeating, 1 host out of memory" {
		t.Errorf("reasons: %q", s)
	}
	got, why = tbl.Choose(Request{Region: 1, MemoryMB: 1024}, rng)
	if len(got) != 1 || got[0].Slot != 6 {
		t.Fatalf("placed on %v (%s), want the one eligible host 6", got, why)
	}
	got, why = tbl.Choose(Request{Region: 1, MemoryMB: 1024, Features: []string{"avx2"}}, rng)
	if len(got) != 0 || why.String() != "2 hosts draining, 1 host lacking avx2, 1 host not heartbeating, 1 host out of memory" {
		t.Fatalf("placed on %v; reasons %q", got, why)
	}
	if why.Capacity() {
		t.Error("draining hosts are not a capacity shortage")
	}
	onlyFull := NewTable([]clusterdb.Host{full}, time.Now())
	if _, why := onlyFull.Choose(Request{Region: 1, MemoryMB: 1024}, rng); !why.Capacity() || why.String() != "1 host out of memory" {
		t.Errorf("only memory missing: %q capacity=%v", why, why.Capacity())
	}
}

// Locality wins over load: a host with a ready pool of the template, or
// the snapshot's standby; among equals the least loaded.
func TestChoosePrefersLocality(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	busyWithPool := host(1, 1, 8192, 4096)
	busyWithPool.Capacity.Ready = map[string]int{"base": 2}
	idle := host(2, 1, 8192, 0)
	tbl := NewTable([]clusterdb.Host{busyWithPool, idle}, time.Now())
	if got, _ := tbl.Choose(Request{Region: 1, MemoryMB: 512, Template: "base"}, rng); got[0].Slot != 1 {
		t.Errorf("template with a ready pool placed on %d", got[0].Slot)
	}
	if got, _ := tbl.Choose(Request{Region: 1, MemoryMB: 512, Template: "other"}, rng); got[0].Slot != 2 {
		t.Errorf("no locality: placed on %d, want the idle host", got[0].Slot)
	}
	if got, why := tbl.Choose(Request{Region: 1, MemoryMB: 512, Slot: 1}, rng); len(got) != 1 || got[0].Slot != 1 {
		t.Errorf("a required host: %v %s", got, why)
	}
}

// Decision time is flat in the number of hosts.
func BenchmarkChoose(b *testing.B) {
	for _, n := range []int{1, 100, 1000, 10000} {
		hosts := make([]clusterdb.Host, n)
		for i := range hosts {
			hosts[i] = host(i+1, 1, 65536, int64(i%60000))
			if i%3 == 0 {
				hosts[i].Capacity.Ready = map[string]int{"base": 1}
			}
		}
		tbl := NewTable(hosts, time.Now())
		rng := rand.New(rand.NewPCG(5, 6))
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			for b.Loop() {
				if got, _ := tbl.Choose(Request{Region: 1, MemoryMB: 1024, Template: "base"}, rng); len(got) == 0 {
					b.Fatal("nothing placed")
				}
			}
		})
	}
}

// A snapshot in the chunk store goes to the host holding its image when
// that host can take it, else to any host of the build that wrote it.
func TestChooseHomeFirstElseItsBuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	home := host(1, 1, 8192, 6000) // the most loaded
	other := host(2, 1, 8192, 0)
	oldBuild := host(3, 1, 8192, 0)
	oldBuild.Versions = map[string]string{"runsc": "v0"}
	tbl := NewTable([]clusterdb.Host{home, other, oldBuild}, time.Now())
	req := Request{Region: 1, MemoryMB: 512, Home: 1, Versions: []string{"runsc=v1"}}
	for range 20 {
		got, _ := tbl.Choose(req, rng)
		if len(got) != 2 || got[0].Slot != 1 || got[1].Slot != 2 {
			t.Fatalf("placed on %v, want home 1 then 2 (never 3, of another build)", got)
		}
	}
	home.State = "draining"
	tbl = NewTable([]clusterdb.Host{home, other, oldBuild}, time.Now())
	if got, why := tbl.Choose(req, rng); len(got) != 1 || got[0].Slot != 2 {
		t.Fatalf("home draining: placed on %v (%s), want 2", got, why)
	}
}
