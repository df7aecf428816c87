package envd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/agent"
	"github.com/cellfork/cellfork/internal/envd/filesystem"
)

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
}

func (e *env) stat(path string) (*filesystem.EntryInfo, error) {
	res, err := e.fs.Stat(context.Background(), connect.NewRequest(&filesystem.StatRequest{Path: path}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetEntry(), nil
}

func TestStat(t *testing.T) {
	e := newEnv(t)
	file := filepath.Join(e.dir, "a.txt")
	mustWrite(t, file, "hello")
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	if err := os.Chtimes(file, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	got, err := e.stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if got.GetName() != "a.txt" || got.GetType() != filesystem.FileType_FILE_TYPE_FILE || got.GetPath() != file ||
		got.GetSize() != 5 || got.GetMode() != 0o640 || got.GetPermissions() != "-rw-r-----" ||
		got.GetOwner() != "root" || got.GetGroup() != "root" || !got.GetModifiedTime().AsTime().Equal(mtime) ||
		got.GetIsSymlink() || got.SymlinkTarget != nil {
		t.Fatalf("entry = %v", got)
	}

	dir, err := e.stat(e.dir)
	if err != nil || dir.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || !strings.HasPrefix(dir.GetPermissions(), "d") {
		t.Fatalf("dir entry = %v (%v)", dir, err)
	}

	link := filepath.Join(e.dir, "link")
	if err := os.Symlink("a.txt", link); err != nil {
		t.Fatal(err)
	}
	got, err = e.stat(link)
	if err != nil || !got.GetIsSymlink() || got.GetSymlinkTarget() != file || got.GetType() != filesystem.FileType_FILE_TYPE_FILE || got.GetMode() != 0o640 {
		t.Fatalf("symlink entry = %v (%v)", got, err)
	}
	broken := filepath.Join(e.dir, "broken")
	if err := os.Symlink("nowhere", broken); err != nil {
		t.Fatal(err)
	}
	got, err = e.stat(broken)
	if err != nil || !got.GetIsSymlink() || got.GetType() != filesystem.FileType_FILE_TYPE_UNSPECIFIED {
		t.Fatalf("broken symlink entry = %v (%v)", got, err)
	}

	_, err = e.stat(filepath.Join(e.dir, "missing"))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.stat(filepath.Join(file, "below-a-file"))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.stat("/tmp/\x00evil")
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = e.stat("~other/x")
	wantCode(t, err, connect.CodeInvalidArgument)
}

// TestRelativePathsResolveAgainstHome: as upstream envd, a relative path is
// relative to the user's home (not the workdir), ".." included; "" is the
// workdir.
func TestRelativePathsResolveAgainstHome(t *testing.T) {
	e := newEnv(t)
	got, err := e.stat("~")
	if err != nil || got.GetPath() != "/root" {
		t.Fatalf("~ = %v (%v)", got, err)
	}
	name := fmt.Sprintf(".cellfork-envd-test-%d", os.Getpid())
	mustWrite(t, filepath.Join("/root", name), "x")
	t.Cleanup(func() { _ = os.Remove(filepath.Join("/root", name)) })
	for _, p := range []string{name, "./" + name, "sub/../" + name} {
		got, err = e.stat(p)
		if err != nil || got.GetPath() != filepath.Join("/root", name) {
			t.Fatalf("%q = %v (%v)", p, got, err)
		}
	}
	got, err = e.stat("../root/" + name)
	if err != nil || got.GetPath() != filepath.Join("/root", name) {
		t.Fatalf("../root/x = %v (%v)", got, err)
	}
	_, err = e.stat("no-such-file-cellfork-test")
	wantCode(t, err, connect.CodeNotFound)
	got, err = e.stat("")
	if err != nil || got.GetPath() != e.dir {
		t.Fatalf("empty path = %v (%v), want the workdir", got, err)
	}
}

func TestResolvePath(t *testing.T) {
	acc := agent.Account{Name: "user", Home: "/home/user"}
	for _, c := range []struct{ in, workdir, want string }{
		{"data.csv", "/work", "/home/user/data.csv"},
		{"a/b/../c", "", "/home/user/a/c"},
		{"../../../../etc/passwd", "", "/etc/passwd"},
		{".", "", "/home/user"},
		{"", "/work", "/work"},
		{"", "", "/home/user"},
		{"~/x", "", "/home/user/x"},
		{"/abs//p/", "", "/abs/p"},
	} {
		got, err := resolvePath(c.in, acc, c.workdir)
		if err != nil || got != c.want {
			t.Errorf("resolvePath(%q, workdir %q) = %q, %v; want %q", c.in, c.workdir, got, err, c.want)
		}
	}
	for _, bad := range []string{"~root/x", "a\x00b", strings.Repeat("a/", 2100)} {
		if _, err := resolvePath(bad, acc, ""); classify(err) != kindInvalid {
			t.Errorf("resolvePath(%.20q) = %v, want invalid", bad, err)
		}
	}
}

func TestStatMetadata(t *testing.T) {
	e := newEnv(t)
	file := filepath.Join(e.dir, "m.txt")
	mustWrite(t, file, "x")
	if err := syscall.Setxattr(file, "user.e2b.owner", []byte("alice"), 0); err != nil {
		t.Skipf("no user xattrs here: %v", err)
	}
	_ = syscall.Setxattr(file, "user.other", []byte("ignored"), 0)
	got, err := e.stat(file)
	if err != nil || len(got.GetMetadata()) != 1 || got.GetMetadata()["owner"] != "alice" {
		t.Fatalf("metadata = %v (%v)", got.GetMetadata(), err)
	}
}

func TestListDir(t *testing.T) {
	e := newEnv(t)
	mustWrite(t, filepath.Join(e.dir, "f1"), "1")
	mustWrite(t, filepath.Join(e.dir, "sub", "f2"), "22")
	mustWrite(t, filepath.Join(e.dir, "sub", "deeper", "f3"), "333")
	if err := os.Symlink("sub", filepath.Join(e.dir, "ln")); err != nil {
		t.Fatal(err)
	}
	list := func(path string, depth uint32) []string {
		t.Helper()
		res, err := e.fs.ListDir(context.Background(), connect.NewRequest(&filesystem.ListDirRequest{Path: path, Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, en := range res.Msg.GetEntries() {
			rel, _ := filepath.Rel(path, en.GetPath())
			out = append(out, rel+":"+strings.TrimPrefix(en.GetType().String(), "FILE_TYPE_"))
		}
		slices.Sort(out)
		return out
	}
	if got, want := list(e.dir, 0), []string{"f1:FILE", "ln:DIRECTORY", "sub:DIRECTORY"}; !slices.Equal(got, want) {
		t.Fatalf("depth 0: %v, want %v", got, want)
	}
	if got, want := list(e.dir, 2), []string{"f1:FILE", "ln:DIRECTORY", "sub/deeper:DIRECTORY", "sub/f2:FILE", "sub:DIRECTORY"}; !slices.Equal(got, want) {
		t.Fatalf("depth 2: %v, want %v", got, want)
	}
	// Listing through a symlink reports paths under the symlink.
	if got, want := list(filepath.Join(e.dir, "ln"), 1), []string{"deeper:DIRECTORY", "f2:FILE"}; !slices.Equal(got, want) {
		t.Fatalf("via symlink: %v, want %v", got, want)
	}
	res, err := e.fs.ListDir(context.Background(), connect.NewRequest(&filesystem.ListDirRequest{Path: filepath.Join(e.dir, "ln")}))
	if err != nil || !strings.HasPrefix(res.Msg.GetEntries()[0].GetPath(), filepath.Join(e.dir, "ln")+"/") {
		t.Fatalf("entries %v (%v)", res.Msg.GetEntries(), err)
	}

	_, err = e.fs.ListDir(context.Background(), connect.NewRequest(&filesystem.ListDirRequest{Path: filepath.Join(e.dir, "nope")}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.fs.ListDir(context.Background(), connect.NewRequest(&filesystem.ListDirRequest{Path: filepath.Join(e.dir, "f1")}))
	wantCode(t, err, connect.CodeInvalidArgument)
	empty := filepath.Join(e.dir, "empty")
	_ = os.Mkdir(empty, 0o755)
	res, err = e.fs.ListDir(context.Background(), connect.NewRequest(&filesystem.ListDirRequest{Path: empty}))
	if err != nil || len(res.Msg.GetEntries()) != 0 {
		t.Fatalf("empty dir: %v (%v)", res.Msg, err)
	}
}

func TestMakeDir(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	dir := filepath.Join(e.dir, "a", "b", "c")
	req := connect.NewRequest(&filesystem.MakeDirRequest{Path: dir})
	asUser(req.Header(), "nobody")
	res, err := e.fs.MakeDir(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if en := res.Msg.GetEntry(); en.GetPath() != dir || en.GetName() != "c" || en.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || en.GetOwner() != "nobody" {
		t.Fatalf("entry = %v", en)
	}
	for _, d := range []string{filepath.Join(e.dir, "a"), filepath.Join(e.dir, "a", "b"), dir} {
		fi, _ := os.Stat(d)
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65534 || st.Gid != 65534 {
			t.Fatalf("%s owned by %d:%d", d, st.Uid, st.Gid)
		}
	}
	if fi, _ := os.Stat(e.dir); fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatal("existing parent was chowned")
	}
	_, err = e.fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: dir}))
	wantCode(t, err, connect.CodeAlreadyExists)
	mustWrite(t, filepath.Join(e.dir, "file"), "")
	_, err = e.fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: filepath.Join(e.dir, "file")}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = e.fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: filepath.Join(e.dir, "file", "sub")}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

func TestMove(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	src := filepath.Join(e.dir, "src.txt")
	mustWrite(t, src, "data")
	dst := filepath.Join(e.dir, "new", "parent", "dst.txt")
	res, err := e.fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: src, Destination: dst}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetEntry().GetPath() != dst || res.Msg.GetEntry().GetSize() != 4 {
		t.Fatalf("entry = %v", res.Msg.GetEntry())
	}
	if _, err := os.Stat(src); !os.IsNotExist(err) {
		t.Fatalf("source still there: %v", err)
	}
	_, err = e.fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: src, Destination: dst}))
	wantCode(t, err, connect.CodeNotFound)
}

func TestMoveAcrossFilesystems(t *testing.T) {
	e := newEnv(t)
	shm := "/dev/shm"
	if _, err := os.Stat(shm); err != nil {
		t.Skip("no /dev/shm")
	}
	var a, b syscall.Statfs_t
	if syscall.Statfs(shm, &a) != nil || syscall.Statfs(e.dir, &b) != nil || a.Fsid == b.Fsid {
		t.Skip("/dev/shm is on the same filesystem")
	}
	src, err := os.CreateTemp(shm, "cellfork-envd-*")
	if err != nil {
		t.Skip(err)
	}
	_, _ = src.WriteString("across")
	_ = src.Close()
	t.Cleanup(func() { _ = os.Remove(src.Name()) })
	dst := filepath.Join(e.dir, "moved")
	if _, err := e.fs.Move(context.Background(), connect.NewRequest(&filesystem.MoveRequest{Source: src.Name(), Destination: dst})); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "across" {
		t.Fatalf("dst = %q (%v)", b, err)
	}
	if _, err := os.Stat(src.Name()); !os.IsNotExist(err) {
		t.Fatal("source left behind")
	}
}

func TestRemove(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	mustWrite(t, filepath.Join(e.dir, "tree", "x", "y"), "1")
	for _, p := range []string{filepath.Join(e.dir, "tree", "x", "y"), filepath.Join(e.dir, "tree")} {
		if _, err := e.fs.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: p})); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("%s still exists", p)
		}
	}
	// What does not exist is already removed, as upstream (os.RemoveAll),
	// also below a file.
	mustWrite(t, filepath.Join(e.dir, "file"), "1")
	for _, p := range []string{filepath.Join(e.dir, "tree"), filepath.Join(e.dir, "file", "below")} {
		if _, err := e.fs.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: p})); err != nil {
			t.Fatalf("removing missing %s: %v", p, err)
		}
	}
	_, err := e.fs.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: "/"}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

func TestFilesystemUnknownUser(t *testing.T) {
	e := newEnv(t)
	req := connect.NewRequest(&filesystem.StatRequest{Path: "/"})
	asUser(req.Header(), "no-such-user-xyz")
	_, err := e.fs.Stat(context.Background(), req)
	wantCode(t, err, connect.CodeUnauthenticated)
}
