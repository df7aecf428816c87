package layers

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
)

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// tree lists the files under root as "path=content" (dirs "path/",
// links "path->target").
func tree(t *testing.T, root string) string {
	t.Helper()
	var out []string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case fi.IsDir():
			out = append(out, rel+"/")
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out = append(out, rel+"->"+l)
		default:
			b, _ := os.ReadFile(p)
			out = append(out, rel+"="+string(b))
		}
		return nil
	})
	sort.Strings(out)
	return strings.Join(out, " ")
}

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("overlay mounts need root")
	}
}

// TestStepLayers runs two steps' worth of changes through real overlay
// mounts and checks that flattening the layers gives what the merged view
// showed: new, changed and removed files, a replaced directory, a link.
func TestStepLayers(t *testing.T) {
	needRoot(t)
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir() // an external base, like the built-in template's root
	write(t, filepath.Join(base, "etc/os"), "debian")
	write(t, filepath.Join(base, "keep"), "keep")
	write(t, filepath.Join(base, "gone"), "gone")
	write(t, filepath.Join(base, "dir/old"), "old")
	b, err := s.AddExternal(Key("base"), base, "FROM base", map[string]string{"user": "root"})
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := s.AddExternal(Key("base"), base, "FROM base", nil); again.ID != b.ID {
		t.Error("the same base was added twice")
	}

	p, err := s.Begin(Key("step1"), b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Mount(context.Background(), []string{LowerPath(b.ID)}); err != nil {
		t.Fatal(err)
	}
	m := p.Merged()
	write(t, filepath.Join(m, "etc/os"), "changed")
	write(t, filepath.Join(m, "new"), "new")
	os.Remove(filepath.Join(m, "gone"))
	os.RemoveAll(filepath.Join(m, "dir"))
	write(t, filepath.Join(m, "dir/fresh"), "fresh") // dir replaced: opaque
	os.Symlink("etc/os", filepath.Join(m, "link"))
	want := tree(t, m)
	l1, err := p.Commit("RUN step 1", map[string]string{"user": "user"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(base + "/gone"); err != nil {
		t.Fatal("the step changed the layer below it")
	}
	if got, ok := s.Lookup(Key("step1")); !ok || got.ID != l1.ID || string(got.Meta) != `{"user":"user"}` {
		t.Errorf("Lookup = %+v, %v", got, ok)
	}
	chain, err := s.Chain(l1.ID)
	if err != nil || len(chain) != 2 || chain[0] != b.ID {
		t.Fatalf("Chain = %v, %v", chain, err)
	}
	dst := filepath.Join(t.TempDir(), "rootfs")
	if err := s.Flatten(chain, dst); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, dst); got != want {
		t.Errorf("flattened:\n %s\nmerged view was:\n %s", got, want)
	}
	// Files are links to the layers' (one inode).
	a, _ := os.Stat(filepath.Join(dst, "keep"))
	c, _ := os.Stat(filepath.Join(base, "keep"))
	if a.Sys().(*syscall.Stat_t).Ino != c.Sys().(*syscall.Stat_t).Ino {
		t.Error("the root copies files instead of linking them")
	}
	// Usage counts shared inodes once.
	one, _ := DiskUsage(nil, base)
	both, _ := DiskUsage(nil, base, dst)
	if both >= 2*one {
		t.Errorf("usage of base and its flattened copy %d, base alone %d: links counted twice", both, one)
	}

	// A second store sees the committed layers.
	s2, err := Open(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if len(s2.List()) != 2 {
		t.Errorf("reopened store has %d layers, want 2", len(s2.List()))
	}
	// Removing a layer keeps the external base's files.
	if err := s.Remove(b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(base, "keep")); err != nil {
		t.Error("removing the external layer removed its files")
	}
}

// TestAbortLeavesNothing: a step that fails leaves no mount and no
// directory behind; a store opened after a crash cleans up half layers.
func TestAbortLeavesNothing(t *testing.T) {
	needRoot(t)
	s, _ := Open(t.TempDir())
	base := t.TempDir()
	write(t, filepath.Join(base, "f"), "f")
	b, _ := s.AddExternal(Key("b"), base, "base", nil)
	p, _ := s.Begin(Key("x"), b.ID)
	if err := p.Mount(context.Background(), []string{LowerPath(b.ID)}); err != nil {
		t.Fatal(err)
	}
	p.Abort()
	ents, _ := os.ReadDir(s.Dir())
	if len(ents) != 1 {
		t.Errorf("after Abort the store holds %v", ents)
	}
	if mounted(s.Dir()) {
		t.Error("a mount was left")
	}
	// A crash mid-step: Open unmounts and removes it.
	p, _ = s.Begin(Key("y"), b.ID)
	if err := p.Mount(context.Background(), []string{LowerPath(b.ID)}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(s.Dir()); err != nil {
		t.Fatal(err)
	}
	if mounted(s.Dir()) {
		t.Error("Open left the crashed step's mount")
	}
	if ents, _ := os.ReadDir(s.Dir()); len(ents) != 1 {
		t.Errorf("Open left %v", ents)
	}
}

func mounted(dir string) bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	return strings.Contains(string(b), dir)
}

func TestKeyIsUnambiguous(t *testing.T) {
	if Key("ab", "c") == Key("a", "bc") {
		t.Error("Key joins parts ambiguously")
	}
	if Key("a") != Key("a") {
		t.Error("Key is not deterministic")
	}
}
