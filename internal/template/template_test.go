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

// Daemons of different versions sharing a rootfs each get their own agent
// directory; neither rewrites the other's files (a checkpoint must restore
// against the files it was taken with).
func TestAgentVersionsCoexist(t *testing.T) {
	rootfs := t.TempDir()
	install := func(content string) string {
		dir := t.TempDir()
		for _, f := range AgentFiles {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(content+f), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		r := NewRegistry(t.TempDir(), dir)
		if err := r.InstallAgent(rootfs); err != nil {
			t.Fatal(err)
		}
		if err := r.InstallAgent(rootfs); err != nil { // again: a no-op
			t.Fatal(err)
		}
		p, err := r.AgentPath()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b := install("v1"), install("v2")
	if a == b || filepath.Dir(a) == filepath.Dir(b) {
		t.Fatalf("two versions share %s", a)
	}
	for p, want := range map[string]string{a: "v1", b: "v2"} {
		got, err := os.ReadFile(filepath.Join(rootfs, p))
		if err != nil || string(got) != want+"cellfork-agent" {
			t.Errorf("%s = %q, %v", p, got, err)
		}
		if _, err := os.Stat(filepath.Join(rootfs, filepath.Dir(p), "kernel.py")); err != nil {
			t.Error(err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(rootfs, AgentDir, ".install-*")); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}
