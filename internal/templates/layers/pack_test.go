package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackAdopt: a step layer made through a real overlay (a whiteout, an
// opaque directory, a hard link, a symbolic link, a set-uid file) packed
// on one host and adopted on another flattens to the same root there.
func TestPackAdopt(t *testing.T) {
	needRoot(t)
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	write(t, filepath.Join(base, "gone"), "gone")
	write(t, filepath.Join(base, "dir/old"), "old")
	write(t, filepath.Join(base, "keep"), "keep")
	b, err := s.AddExternal(Key("base"), base, "FROM base", nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Begin(Key("step"), b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Mount(context.Background(), []string{LowerPath(b.ID)}); err != nil {
		t.Fatal(err)
	}
	m := p.Merged()
	os.Remove(filepath.Join(m, "gone"))
	os.RemoveAll(filepath.Join(m, "dir"))
	write(t, filepath.Join(m, "dir/fresh"), "fresh")
	write(t, filepath.Join(m, "bin/tool"), "tool")
	os.Chown(filepath.Join(m, "bin/tool"), 1000, 1000)
	os.Chmod(filepath.Join(m, "bin/tool"), os.ModeSetuid|0o755)
	os.Link(filepath.Join(m, "bin/tool"), filepath.Join(m, "bin/tool2"))
	os.Symlink("../keep", filepath.Join(m, "bin/keep"))
	l, err := p.Commit("RUN step", map[string]string{"user": "user"})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := s.Pack(l.ID, &buf); err != nil {
		t.Fatal(err)
	}
	if err := s.Pack(b.ID, &bytes.Buffer{}); err == nil {
		t.Error("packing an external base layer succeeded")
	}

	// The other host: the same base root, its own store.
	s2, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b2, err := s2.AddExternal(Key("base"), base, "FROM base", nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s2.Adopt(Layer{ID: l.ID, Key: l.Key, Parent: b2.ID, Step: l.Step, Meta: l.Meta}, bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != l.ID || string(got.Meta) != `{"user":"user"}` {
		t.Errorf("adopted %+v", got)
	}
	if again, err := s2.Adopt(Layer{ID: l.ID}, strings.NewReader("not a tar")); err != nil || again.ID != l.ID {
		t.Errorf("adopting a layer already here: %+v, %v", again, err)
	}
	want := filepath.Join(t.TempDir(), "a")
	have := filepath.Join(t.TempDir(), "b")
	if err := s.Flatten([]string{b.ID, l.ID}, want); err != nil {
		t.Fatal(err)
	}
	if err := s2.Flatten([]string{b2.ID, l.ID}, have); err != nil {
		t.Fatal(err)
	}
	if w, h := tree(t, want), tree(t, have); w != h || strings.Contains(h, "gone") || strings.Contains(h, "old") {
		t.Errorf("flattened on the other host:\n %s\nhere:\n %s", h, w)
	}
	fi, err := os.Stat(filepath.Join(have, "bin/tool"))
	if err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("bin/tool: %v %v", fi, err)
	}
	a, _ := os.Stat(filepath.Join(s2.DiffPath(l.ID), "bin/tool"))
	c, _ := os.Stat(filepath.Join(s2.DiffPath(l.ID), "bin/tool2"))
	if !os.SameFile(a, c) {
		t.Error("the hard link became a copy")
	}
}

// TestAdoptRefusesEscapes: an archive that would write outside the layer
// (through a symbolic link it made, or a hard link out) or holds a device
// is refused, and leaves nothing.
func TestAdoptRefusesEscapes(t *testing.T) {
	needRoot(t)
	outside := t.TempDir()
	for name, entries := range map[string][]tar.Header{
		"through a link": {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside}, {Name: "l/x", Typeflag: tar.TypeReg}},
		"hard link out":  {{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../../../etc/passwd"}},
		"a device":       {{Name: "d", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
	} {
		s, err := Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			h.Mode = 0o644
			tw.WriteHeader(&h)
		}
		tw.Close()
		if _, err := s.Adopt(Layer{ID: "abc"}, &buf); err == nil {
			t.Errorf("%s: adopted", name)
		}
		if ents, _ := os.ReadDir(s.Dir()); len(ents) != 0 {
			t.Errorf("%s: left %v", name, ents)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Errorf("%s: wrote outside: %v", name, ents)
		}
	}
}
