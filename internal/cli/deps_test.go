package cli

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps checks that the CLI links no daemon, runtime or store code: of
// this module only internal/client and the generated wire code
// (internal/envd and internal/envd/..., internal/api/apitypes, not internal/api itself),
// and outside the standard library only connect and protobuf (which the
// generated envd code needs).
func TestDeps(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not found")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const self = "github.com/cellfork/cellfork/"
	for _, pkg := range strings.Fields(string(out)) {
		switch {
		case pkg == self+"internal/cli" || pkg == self+"internal/client":
		case pkg == self+"internal/envd", strings.HasPrefix(pkg, self+"internal/envd/"), pkg == self+"internal/api/apitypes":
		case pkg == "connectrpc.com/connect" || strings.HasPrefix(pkg, "connectrpc.com/connect/internal/"):
		case strings.HasPrefix(pkg, "google.golang.org/protobuf/"):
		default:
			t.Errorf("internal/cli depends on %s", pkg)
		}
	}
}
