package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// entry is one tar entry of a test archive.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid              int
}

func tarOf(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		h := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Linkname: e.link, Size: int64(len(e.body)),
			Uid: e.uid, Gid: e.uid, ModTime: time.Unix(1700000000, 0)}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			io.WriteString(tw, e.body)
		}
	}
	tw.Close()
	return buf.Bytes()
}

func layerOf(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	b := tarOf(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("reading %s: %v", p, err)
	}
	return string(b)
}

// TestExtractStaysInRoot feeds archives that try to write outside the
// root: every write lands inside it, or the archive is refused.
func TestExtractStaysInRoot(t *testing.T) {
	outside := t.TempDir()
	root := t.TempDir()
	arch := tarOf(t,
		entry{name: "etc", typ: tar.TypeSymlink, link: outside},            // an absolute link out
		entry{name: "etc/passwd", body: "inside"},                          // must land in root/<outside>/passwd
		entry{name: "up", typ: tar.TypeSymlink, link: "../../../../../.."}, // a relative link out
		entry{name: "up/escaped", body: "inside too"},
		entry{name: "dev/null", typ: tar.TypeChar}, // devices are skipped
		entry{name: "hard", typ: tar.TypeLink, link: "etc/passwd"},
		entry{name: "bin/su", body: "x", mode: 0o4755}, // set-uid kept
	)
	if err := Extract(context.Background(), bytes.NewReader(arch), root, 0); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("the archive wrote outside the root: %v", ents)
	}
	if got := readFile(t, filepath.Join(root, outside, "passwd")); got != "inside" {
		t.Errorf("etc/passwd through an absolute link = %q", got)
	}
	if got := readFile(t, filepath.Join(root, "escaped")); got != "inside too" {
		t.Errorf("up/escaped through a relative link = %q", got)
	}
	if _, err := os.Lstat(filepath.Join(root, "dev", "null")); err == nil {
		t.Error("a device node was created")
	}
	if got := readFile(t, filepath.Join(root, "hard")); got != "inside" {
		t.Errorf("hard link = %q", got)
	}
	fi, err := os.Stat(filepath.Join(root, "bin", "su"))
	if err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("set-uid bit lost: %v %v", fi, err)
	}
	// Names that climb out are cleaned to names inside the root.
	parent := t.TempDir()
	root2 := filepath.Join(parent, "root")
	os.Mkdir(root2, 0o755)
	arch = tarOf(t, entry{name: "../x", body: "x"}, entry{name: "a", typ: tar.TypeLink, link: "../../x"})
	if err := Extract(context.Background(), bytes.NewReader(arch), root2, 0); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 1 {
		t.Errorf("wrote beside the root: %v", ents)
	}
	if got := readFile(t, filepath.Join(root2, "a")); got != "x" {
		t.Errorf("a = %q, want the link to root/x", got)
	}
}

func TestExtractSizeLimit(t *testing.T) {
	arch := tarOf(t, entry{name: "a", body: strings.Repeat("x", 1<<20)}, entry{name: "b", body: strings.Repeat("y", 1<<20)})
	err := Extract(context.Background(), bytes.NewReader(arch), t.TempDir(), 1<<20+100)
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("over the limit: %v, want resource exhausted", err)
	}
}

// testImage has two layers: the second removes a file of the first
// (whiteout) and replaces a directory (opaque).
func testImage(t *testing.T) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image,
		layerOf(t, entry{name: "bin", typ: tar.TypeDir}, entry{name: "bin/sh", body: "shell", mode: 0o755},
			entry{name: "gone", body: "x"}, entry{name: "d", typ: tar.TypeDir}, entry{name: "d/old", body: "old"},
			entry{name: "home/user/f", body: "mine", uid: 1000}),
		layerOf(t, entry{name: ".wh.gone", body: ""}, entry{name: "d", typ: tar.TypeDir},
			entry{name: "d/.wh..wh..opq"}, entry{name: "d/new", body: "new"}),
	)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin", "A=1"}, WorkingDir: "/w", Cmd: []string{"sleep", "1"}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func checkTestImage(t *testing.T, root string) {
	t.Helper()
	if got := readFile(t, filepath.Join(root, "bin", "sh")); got != "shell" {
		t.Errorf("bin/sh = %q", got)
	}
	for _, p := range []string{"gone", "d/old"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s survived its whiteout", p)
		}
	}
	if got := readFile(t, filepath.Join(root, "d", "new")); got != "new" {
		t.Errorf("d/new = %q", got)
	}
	fi, err := os.Stat(filepath.Join(root, "home", "user", "f"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 {
		t.Errorf("home/user/f is owned by %d, want 1000", st.Uid)
	}
}

func TestPullAndUnpack(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	img := testImage(t)
	ref, _ := name.ParseReference(host + "/team/app:v1")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	p := &Puller{}
	got, err := p.Pull(context.Background(), host+"/team/app:v1", Auth{})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := Unpack(context.Background(), got, root, 0); err != nil {
		t.Fatal(err)
	}
	checkTestImage(t, root)
	cfg, err := ImageConfig(got)
	if err != nil || cfg.WorkingDir != "/w" || len(cfg.Env) != 2 || cfg.Cmd[0] != "sleep" {
		t.Errorf("config = %+v, %v", cfg, err)
	}
	want, _ := Digest(img)
	if d, _ := Digest(got); d != want {
		t.Errorf("digest %s, want %s", d, want)
	}

	// Docker Hub names go to the mirror.
	hub, _ := name.ParseReference(host + "/library/ubuntu:22.04")
	if err := remote.Write(hub, img); err != nil {
		t.Fatal(err)
	}
	m := &Puller{Mirrors: map[string]string{"index.docker.io": host}}
	if _, err := m.Pull(context.Background(), "ubuntu:22.04", Auth{}); err != nil {
		t.Errorf("pull through the mirror: %v", err)
	}

	if _, err := p.Pull(context.Background(), host+"/team/nope:v1", Auth{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing image: %v, want not found", err)
	}
	if _, err := p.Pull(context.Background(), "UPPER/case", Auth{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad reference: %v, want invalid argument", err)
	}
	u, _ := url.Parse(srv.URL)
	srv.Close()
	_, err = (&Puller{Timeout: 5 * time.Second}).Pull(context.Background(), u.Host+"/team/app:v1", Auth{})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(errdefs.UserMessage(err), "unreachable") {
		t.Errorf("registry down: %v, want unavailable (unreachable)", err)
	}
}

func TestLoadArchives(t *testing.T) {
	img := testImage(t)
	dir := t.TempDir()
	// docker save
	tag, _ := name.NewTag("example/app:v1")
	dockerTar := filepath.Join(dir, "docker.tar")
	if err := tarball.WriteToFile(dockerTar, tag, img); err != nil {
		t.Fatal(err)
	}
	// OCI archive: a layout, tarred
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(dir, "oci.tar")
	tarDir(t, filepath.Join(dir, "layout"), ociTar)
	for _, p := range []string{dockerTar, ociTar, filepath.Join(dir, "layout")} {
		got, cleanup, err := Load(p)
		if err != nil {
			t.Fatalf("Load(%s): %v", filepath.Base(p), err)
		}
		root := t.TempDir()
		if err := Unpack(context.Background(), got, root, 0); err != nil {
			t.Fatal(err)
		}
		checkTestImage(t, root)
		cleanup()
	}
	bad := filepath.Join(dir, "bad.tar")
	os.WriteFile(bad, tarOf(t, entry{name: "x", body: "y"}), 0o644)
	if _, _, err := Load(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("archive without an image: %v", err)
	}
	os.WriteFile(bad, []byte("not a tar"), 0o644)
	if _, _, err := Load(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("not a tar: %v", err)
	}
}

func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	defer tw.Close()
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h, _ := tar.FileInfoHeader(fi, "")
		h.Name = rel
		tw.WriteHeader(h)
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			tw.Write(b)
		}
		return nil
	})
}

// FuzzExtract: whatever the archive, nothing is written beside the root.
func FuzzExtract(f *testing.F) {
	f.Add([]byte{})
	t := &testing.T{}
	f.Add(tarOf(t, entry{name: "l", typ: tar.TypeSymlink, link: ".."}, entry{name: "l/x", body: "x"}))
	f.Add(tarOf(t, entry{name: "l", typ: tar.TypeSymlink, link: "/"}, entry{name: "l/../x", body: "x"}))
	f.Add(tarOf(t, entry{name: "h", typ: tar.TypeLink, link: "../x"}, entry{name: "./../../y", body: "y"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		root := filepath.Join(parent, "root")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		_ = Extract(context.Background(), bytes.NewReader(data), root, 1<<20)
		if ents, _ := os.ReadDir(parent); len(ents) != 1 {
			t.Fatalf("wrote beside the root: %v", ents)
		}
	})
}
