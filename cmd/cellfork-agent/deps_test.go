package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps the in-sandbox agent free of daemon code: it runs inside
// untrusted sandboxes and must not carry the runtime, store or API.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"/internal/api", "/internal/manager", "/internal/runtime", "/internal/store",
			"/internal/netns", "/internal/daemon", "/internal/cli", "modernc.org/sqlite"} {
			if strings.Contains(dep, banned) {
				t.Errorf("agent links %s", dep)
			}
		}
	}
}
