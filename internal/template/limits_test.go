package template

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// The base template ships its limits file with every value commented out:
// the daemon's defaults apply to it.
func TestBaseTemplateLimits(t *testing.T) {
	l, err := Limits("base")
	if err != nil {
		t.Fatal(err)
	}
	if l != (sandbox.Limits{}) {
		t.Errorf("base sets limits %+v; the daemon's flags would never apply to it", l)
	}
	if l, err := Limits("no-such-template"); err != nil || l != (sandbox.Limits{}) {
		t.Errorf("a template without a limits file: %+v, %v", l, err)
	}
}

// A template's limits are not part of its hash: editing them rebuilds no
// rootfs.
func TestLimitsNotInHash(t *testing.T) {
	h1, _ := Hash("base")
	if _, err := Limits("base"); err != nil {
		t.Fatal(err)
	}
	h2, _ := Hash("base")
	if h1 != h2 || h1 == "" {
		t.Fatalf("hash %q / %q", h1, h2)
	}
}

func TestParsePairs(t *testing.T) {
	l, err := parsePairs([]string{"cpuCount = 2", " memoryMB=2048 ", "diskSizeMB = 300", "pidsMax=200", "openFiles = 4096"})
	want := sandbox.Limits{CPUCount: 2, MemoryMB: 2048, DiskMB: 300, PidsMax: 200, OpenFiles: 4096}
	if err != nil || l != want {
		t.Fatalf("parsePairs = %+v, %v", l, err)
	}
	for _, bad := range []string{"cpus = 2", "memoryMB = 0", "memoryMB = -1", "memoryMB = lots", "memoryMB"} {
		if _, err := parsePairs([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseLimitsFlag(t *testing.T) {
	name, l, err := ParseLimitsFlag("code-interpreter-v1:diskSizeMB=300,pidsMax=200")
	if err != nil || name != "base" || l != (sandbox.Limits{DiskMB: 300, PidsMax: 200}) {
		t.Fatalf("ParseLimitsFlag = %q %+v %v", name, l, err)
	}
	for _, bad := range []string{"base", "base:", "nope:cpuCount=1", "base:cpuCount=x", "base:cpu=1", ":cpuCount=1"} {
		if _, _, err := ParseLimitsFlag(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, _, err := ParseLimitsFlag("base:ram=1"); err == nil || !strings.Contains(err.Error(), "known: cpuCount") {
		t.Errorf("unknown name error does not list the known ones: %v", err)
	}
}

func TestNames(t *testing.T) {
	if n := Names(); len(n) != 1 || n[0] != "base" {
		t.Errorf("Names = %v", n)
	}
}

// The marker keeps /tmp on the root overlay (gVisor mounts an unbounded
// tmpfs over an empty /tmp only).
func TestKeepTmpOnRoot(t *testing.T) {
	root := t.TempDir()
	for range 2 { // idempotent
		if err := keepTmpOnRoot(root); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(filepath.Join(root, "tmp"))
	if err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Fatalf("/tmp: %v %v", fi.Mode(), err)
	}
	if entries, _ := os.ReadDir(filepath.Join(root, "tmp")); len(entries) != 1 || entries[0].Name() != filepath.Base(TmpMarker) {
		t.Fatalf("/tmp holds %v", entries)
	}
}
