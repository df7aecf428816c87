package manager

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps the manager on its interfaces: it reaches the runtime,
// the networks and the store through internal/sandbox, never their
// implementations; and the packages it runs on (box, pool, snapshots,
// warm, samples) never reach back up to the manager.
func TestDeps(t *testing.T) {
	for pkg, banned := range map[string][]string{
		".":            {"/internal/runtime/gvisor", "/internal/store", "/internal/netns", "/internal/api", "/internal/daemon", "modernc.org/sqlite"},
		"../box":       {"/internal/manager", "/internal/pool", "/internal/runtime/gvisor", "/internal/store", "/internal/netns"},
		"../pool":      {"/internal/manager", "/internal/runtime/gvisor", "/internal/store", "/internal/netns"},
		"../snapshots": {"/internal/manager", "/internal/pool", "/internal/runtime/gvisor", "/internal/store", "/internal/netns"},
		"../warm":      {"/internal/manager", "/internal/snapshots", "/internal/runtime/gvisor", "/internal/store", "/internal/netns"},
		"../samples":   {"/internal/manager", "/internal/pool", "/internal/snapshots", "/internal/runtime/gvisor", "/internal/store", "/internal/netns"},
	} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range banned {
				if strings.HasSuffix(dep, b) || strings.Contains(dep, b+"/") || (strings.Contains(b, ".") && strings.HasPrefix(dep, b)) {
					t.Errorf("%s links %s", pkg, dep)
				}
			}
		}
	}
}
