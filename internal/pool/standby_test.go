package pool

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/sandbox"
)

func TestStandbysLeastRecentlyUsedGoFirst(t *testing.T) {
	p := New(nil, Config{Standbys: 2}, slog.Default())
	lim := sandbox.Limits{CPUCount: 1, MemoryMB: 1024}
	ids := func() []string {
		var out []string
		for _, s := range p.standbys {
			out = append(out, s.id)
		}
		return out
	}
	use := func(id string) { p.UseStandby(id, "img-"+id, "rootfs", lim) }
	use("a")
	first := p.standbys[0]
	use("b")
	use("c")
	if got := ids(); !slices.Equal(got, []string{"b", "c"}) || !first.dropped {
		t.Fatalf("after a, b, c with room for 2: %v (a dropped: %v)", got, first.dropped)
	}
	use("b")
	if got := ids(); !slices.Equal(got, []string{"c", "b"}) {
		t.Fatalf("b used again goes last: %v", got)
	}

	frozen := &box.Box{}
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

	p.DropStandby("b")
	if got := ids(); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("after dropping b: %v", got)
	}
	off := New(nil, Config{}, slog.Default())
	if off.UseStandby("a", "img-a", "rootfs", lim); len(off.standbys) != 0 {
		t.Error("standbys kept with --standby-snapshots 0")
	}
}
