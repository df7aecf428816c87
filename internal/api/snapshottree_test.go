package api

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/api/apitypes"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// render draws a forest as id(children...) for comparison.
func render(nodes []apitypes.SnapshotNode) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "%s(%s)", n.SnapshotID, render(n.Children))
	}
	return b.String()
}

func TestSnapshotForest(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	snap := func(id, parent string, minute int) *sandbox.Snapshot {
		return &sandbox.Snapshot{ID: id, ParentID: parent, SandboxID: "sb", CreatedAt: t0.Add(time.Duration(minute) * time.Minute)}
	}
	for _, c := range []struct {
		name string
		in   []*sandbox.Snapshot
		want string
	}{
		{"none", nil, ""},
		// Siblings keep the list's order (oldest first).
		{"tree", []*sandbox.Snapshot{snap("r", "", 0), snap("a", "r", 1), snap("b", "r", 2), snap("c", "a", 3), snap("o", "", 4)},
			"r(a(c())b())o()"},
		// A parent that is gone: a root that still names it.
		{"orphan", []*sandbox.Snapshot{snap("a", "gone", 0), snap("b", "a", 1)}, "a(b())"},
		// Links the manager never makes: a cycle hanging off nothing, a
		// self-parent and a duplicate. Each snapshot appears once.
		{"odd parents", []*sandbox.Snapshot{snap("x", "y", 0), snap("y", "x", 1), snap("self", "self", 2), snap("z", "x", 3), snap("x", "", 4)},
			"x(z())y()self()"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := snapshotForest(c.in)
			if render(got) != c.want {
				t.Errorf("forest %s, want %s", render(got), c.want)
			}
			if got == nil {
				t.Error("nil forest: it must encode as [], not null")
			}
		})
	}
	roots := snapshotForest([]*sandbox.Snapshot{snap("a", "gone", 0), snap("b", "a", 1)})
	if p := roots[0].ParentID; p == nil || *p != "gone" || roots[0].Children[0].Children == nil {
		t.Errorf("root %+v: want parentID gone and empty (not nil) children", roots[0])
	}
}
