package manager

import (
	"slices"
	"testing"

	"github.com/cellfork/cellfork/internal/sandbox"
)

func TestStandbysLeastRecentlyUsedGoFirst(t *testing.T) {
	p := newPool(&Manager{}, 0, 0, 2)
	lim := sandbox.Limits{CPUCount: 1, MemoryMB: 1024}
	ids := func() []string {
		var out []string
		for _, s := range p.standbys {
			out = append(out, s.id)
		}
		return out
	}
	a, b, c := &sandbox.Snapshot{ID: "a"}, &sandbox.Snapshot{ID: "b"}, &sandbox.Snapshot{ID: "c"}
	p.useStandby(a, lim)
	first := p.standbys[0]
	p.useStandby(b, lim)
	p.useStandby(c, lim)
	if got := ids(); !slices.Equal(got, []string{"b", "c"}) || !first.dropped {
		t.Fatalf("after a, b, c with room for 2: %v (a dropped: %v)", got, first.dropped)
	}
	p.useStandby(b, lim)
	if got := ids(); !slices.Equal(got, []string{"c", "b"}) {
		t.Fatalf("b used again goes last: %v", got)
	}

	frozen := &box{}
	p.standbys[0].box = frozen
	if p.takeStandby("c", sandbox.Limits{CPUCount: 2, MemoryMB: 1024}) != nil {
		t.Error("a standby restored with other limits was handed out")
	}
	if p.takeStandby("c", lim) != frozen || p.standbys[0].box != nil {
		t.Error("the standby was not handed out once")
	}
	if s, _ := p.nextStandby(); s == nil || s.id != "b" {
		t.Errorf("the most recently used missing standby fills first, got %+v", s)
	}

	p.dropStandby("b")
	if got := ids(); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("after dropping b: %v", got)
	}
	off := newPool(&Manager{}, 0, 0, 0)
	if off.useStandby(a, lim); len(off.standbys) != 0 {
		t.Error("standbys kept with --standby-snapshots 0")
	}
}
