package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/templates/layers"
)

// fakeArtifacts is a cluster's artifacts in memory: packed trees by root,
// roots by definition. The real one (the chunk store and PostgreSQL, the
// same PackDir and Unpack) runs in the cluster suite, whose hosts all
// start from the artifact the first one published.
type fakeArtifacts struct {
	mu       sync.Mutex
	blobs    map[string][]byte
	defs     map[string]string
	down     bool // the database does not answer
	pulls    int
	publishs int
}

func newFakeArtifacts() *fakeArtifacts {
	return &fakeArtifacts{blobs: map[string][]byte{}, defs: map[string]string{}}
}

var errDown = errors.New("the cluster database is unavailable")

func (f *fakeArtifacts) Find(_ context.Context, name, def string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return "", errDown
	}
	return f.defs[name+"/"+def], nil
}

func (f *fakeArtifacts) Publish(_ context.Context, name, def, rootfs string) (string, error) {
	var buf bytes.Buffer
	if err := layers.PackDir(rootfs, &buf, func(rel string) bool { return rel == strings.TrimPrefix(AgentDir, "/") }); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	root := hex.EncodeToString(sum[:])
	f.mu.Lock()
	defer f.mu.Unlock()
	f.publishs++
	f.blobs[root] = buf.Bytes()
	if have := f.defs[name+"/"+def]; have != "" {
		return have, nil
	}
	f.defs[name+"/"+def] = root
	return root, nil
}

func (f *fakeArtifacts) Pull(_ context.Context, root, dir string) error {
	f.mu.Lock()
	b, ok := f.blobs[root]
	f.pulls++
	f.mu.Unlock()
	if !ok {
		return errors.New("no such root")
	}
	return layers.Unpack(bytes.NewReader(b), dir)
}

// fakeHost is a host's template directory with a rootfs "built" by hand
// (holding marker, to tell builds apart) and agent files.
func fakeHost(t *testing.T, marker string) (*Registry, string) {
	t.Helper()
	data, agent := t.TempDir(), t.TempDir()
	for _, f := range AgentFiles {
		if err := os.WriteFile(filepath.Join(agent, f), []byte("agent "+f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if marker != "" {
		hash, err := Hash("base")
		if err != nil {
			t.Fatal(err)
		}
		rootfs := filepath.Join(data, "base", hash, "rootfs")
		for p, body := range map[string]string{"etc/os-release": "bookworm", "usr/lib/python3/x.py": marker,
			"opt/cellfork/oldagent/cellfork-agent": "an older agent"} {
			if err := os.MkdirAll(filepath.Join(rootfs, filepath.Dir(p)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(rootfs, p), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink("python3", filepath.Join(rootfs, "usr/lib/python")); err != nil {
			t.Fatal(err)
		}
		old := time.Date(2024, 1, 2, 3, 4, 5, 6789, time.UTC)
		if err := os.Chtimes(filepath.Join(rootfs, "usr/lib/python3/x.py"), old, old); err != nil {
			t.Fatal(err)
		}
	}
	return NewRegistry(data, agent), data
}

// TestArtifactsOneRootfsEverywhere: the first host publishes its build and
// runs on the artifact's unpacked bytes; a host with no build pulls them
// (no debootstrap), and so does a host with a build of its own; all three
// get the same files at the same relative path, their own agent in it,
// and a host restarted while the database is down goes on with what it
// pulled, while one that never pulled says why it cannot start.
func TestArtifactsOneRootfsEverywhere(t *testing.T) {
	ctx := context.Background()
	art := newFakeArtifacts()
	first, firstDir := fakeHost(t, "first build")
	first.Share(art)
	a, err := first.Rootfs(ctx, "base", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	root := first.Artifact("base")
	if len(root) != 64 || filepath.Base(filepath.Dir(a)) != root[:16] || art.publishs != 1 {
		t.Fatalf("rootfs %s, artifact %q, %d publishes", a, root, art.publishs)
	}
	rel, _ := filepath.Rel(firstDir, a)

	bare, bareDir := fakeHost(t, "") // nothing built: debootstrap would fail the test (no network)
	bare.Share(art)
	b, err := bare.Rootfs(ctx, "base", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	own, ownDir := fakeHost(t, "a build of its own")
	own.Share(art)
	c, err := own.Rootfs(ctx, "base", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if art.publishs != 1 || art.pulls != 3 { // the first host unpacks its own too
		t.Fatalf("%d publishes, %d pulls; want 1 and 3", art.publishs, art.pulls)
	}
	for dir, p := range map[string]string{bareDir: b, ownDir: c} {
		if r, _ := filepath.Rel(dir, p); r != rel {
			t.Errorf("rootfs at %s, not %s", r, rel)
		}
	}
	want := tree(t, a)
	for _, p := range []string{b, c} {
		if got := tree(t, p); got != want {
			t.Errorf("%s differs from the first host's:\n%s\nwant\n%s", p, got, want)
		}
	}
	if !strings.Contains(want, "usr/lib/python3/x.py 0644 2024-01-02T03:04:05.000006789Z first build") ||
		strings.Contains(want, "oldagent") || !strings.Contains(want, "usr/lib/python -> python3") {
		t.Errorf("the artifact's tree:\n%s", want)
	}
	agent, _ := first.AgentPath()
	if _, err := os.Stat(filepath.Join(b, agent)); err != nil {
		t.Errorf("the pulled rootfs has no agent: %v", err)
	}

	// Restarted while the database is down: the artifact pulled before.
	art.down = true
	again := NewRegistry(bareDir, own.agentDir)
	again.Share(art)
	if p, err := again.Rootfs(ctx, "base", io.Discard); err != nil || p != b || again.Artifact("base") != root {
		t.Fatalf("restart without the database: %s, %v", p, err)
	}
	never, _ := fakeHost(t, "")
	never.Share(art)
	if _, err := never.Rootfs(ctx, "base", io.Discard); err == nil || !strings.Contains(err.Error(), "cluster") {
		t.Fatalf("a host that never pulled, without the database: %v", err)
	}
}

// tree lists a directory's entries with mode, time and content, the agent
// left out (each host installs its own).
func tree(t *testing.T, root string) string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == strings.TrimPrefix(AgentDir, "/") {
			return fs.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %04o", rel, fi.Mode().Perm())
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line = rel + " -> " + target
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			line = fmt.Sprintf("%s %04o %s %s", rel, fi.Mode().Perm(), fi.ModTime().UTC().Format(time.RFC3339Nano), b)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, "\n")
}
