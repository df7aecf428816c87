package template

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TestPruneSkipsWhatIsInUse: a directory another process (here: another
// open file description) holds InUse survives Prune; once released, it goes.
func TestPruneSkipsWhatIsInUse(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "warm-abc")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	release, err := InUse(dir)
	if err != nil {
		t.Fatal(err)
	}
	// A second holder that drops its release func must keep its lock too.
	if _, err := InUse(dir); err != nil {
		t.Fatal(err)
	}
	runtime.GC() // the lock must not depend on the caller keeping a reference
	runtime.GC()
	if Prune(dir) {
		t.Fatal("pruned a directory in use")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal("directory in use is gone")
	}
	release()
	if Prune(dir) {
		t.Fatal("pruned a directory the second holder still uses")
	}
}

func TestResolveAndHash(t *testing.T) {
	for _, id := range []string{"base", "code-interpreter-v1"} {
		if n, err := Resolve(id); err != nil || n != "base" {
			t.Errorf("Resolve(%q) = %q, %v", id, n, err)
		}
	}
	if _, err := Resolve("nope"); err == nil {
		t.Error("unknown template resolved")
	}
	h1, err := Hash("base")
	h2, _ := Hash("base")
	if err != nil || h1 != h2 || len(h1) != 16 {
		t.Errorf("Hash = %q, %q, %v", h1, h2, err)
	}
	if len(Preimport("base")) == 0 {
		t.Error("base pre-imports nothing")
	}
}

func TestPruneAfterRelease(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rootfs-old")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	release, err := InUse(dir)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if !Prune(dir) {
		t.Fatal("did not prune a released directory")
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatal("directory still there")
	}
}
