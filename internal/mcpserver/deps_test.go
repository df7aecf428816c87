package mcpserver

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps checks that the MCP server links no daemon, runtime or store
// code: of this module only internal/client and the generated wire code
// (internal/envd/..., internal/api/apitypes): it talks to the daemon over
// its public HTTP API, like the CLI.
func TestDeps(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("go tool not found")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const self = "github.com/cellfork/cellfork/"
	for _, pkg := range strings.Fields(string(out)) {
		switch {
		case !strings.HasPrefix(pkg, self):
		case pkg == self+"internal/mcpserver" || pkg == self+"internal/client" || pkg == self+"internal/api/apitypes":
		case pkg == self+"internal/envd", strings.HasPrefix(pkg, self+"internal/envd/"):
		default:
			t.Errorf("internal/mcpserver depends on %s", pkg)
		}
	}
}
