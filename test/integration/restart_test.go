package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cellfork/cellfork/internal/netns/netnstest"
)

// TestDaemonRestart: a crashed daemon's successor adopts the sandboxes that
// still run, and removes what it cannot account for. A second daemon on the
// same data directory refuses to start.
func TestDaemonRestart(t *testing.T) {
	sb := create(t, map[string]any{"timeout": 300})
	run(t, sb, "", "echo kept > /home/user/state.txt")

	second := exec.Command(filepath.Join(repoRoot, "bin", "cellfork"), "serve", "--addr", freeAddr(), "--data-dir", d.dataDir, "--template-dir", templateDir())
	second.Env = append(os.Environ(), "CELLFORK_API_KEY="+apiKey)
	out, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another cellfork daemon") {
		t.Fatalf("second daemon on the same data dir: err=%v out=%s", err, out)
	}

	// Crash the daemon, leave junk behind, start a new one on the same port.
	stray := strayNetns(t)
	addr := strings.TrimPrefix(d.url, "http://")
	_ = d.cmd.Process.Signal(unix.SIGKILL)
	<-d.exited
	for _, suffix := range []string{"-r", "-s"} {
		if err := exec.Command("ip", "netns", "add", stray+suffix).Run(); err != nil {
			t.Fatal(err)
		}
	}
	strayDir := filepath.Join(d.dataDir, "runtimes", "0123456789abcdef01234567")
	_ = os.MkdirAll(strayDir, 0o700)

	nd, err := startDaemon(d.dataDir, addr)
	if err != nil {
		t.Fatal(err)
	}
	d = nd
	if out, _, _ := run(t, sb, "", "cat /home/user/state.txt"); out != "kept\n" {
		t.Errorf("adopted sandbox lost its state: %q", out)
	}
	if r := call(t, "GET", "/sandboxes/"+sb.SandboxID, nil); r.status != 200 {
		t.Errorf("adopted sandbox: %d %s", r.status, r.body)
	}
	// The new daemon serves the adopted sandbox's resolver again.
	if out, _, _ := run(t, sb, "", `python3 -c 'import socket; print(socket.gethostbyname("other.test"))'`); out != netnstest.OtherIP+"\n" {
		t.Errorf("adopted sandbox cannot resolve names: %q", out)
	}
	for _, p := range []string{"/run/netns/" + stray + "-r", "/run/netns/" + stray + "-s", strayDir} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s was not cleaned up", p)
		}
	}
}

// strayNetns returns a network namespace name the daemon would own: its
// prefix (taken from a live runtime's namespace) and an unknown runtime id.
func strayNetns(t *testing.T) string {
	t.Helper()
	sb := create(t, nil)
	m, _ := filepath.Glob("/run/netns/cf*-" + runtimeID(t, sb.SandboxID) + "-r")
	if len(m) != 1 {
		t.Fatalf("cannot find the daemon's netns prefix: %v", m)
	}
	prefix := strings.SplitN(filepath.Base(m[0]), "-", 2)[0]
	return prefix + "-0123456789abcdef01234567"
}
