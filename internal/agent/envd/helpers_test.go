package envd

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/agent"
	"github.com/cellfork/cellfork/internal/envd/filesystem/filesystemconnect"
	"github.com/cellfork/cellfork/internal/envd/process/processconnect"
)

// env is one in-process agent driven through the generated Connect clients
// with the JSON codec, as the Python SDK does.
type env struct {
	t        *testing.T
	dir      string // default workdir, a fresh temp dir
	settings *agent.Settings
	srv      *httptest.Server
	proc     processconnect.ProcessClient
	fs       filesystemconnect.FilesystemClient
}

func newEnv(t *testing.T) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the agent tests need root (setuid, chown)")
	}
	dir := t.TempDir()
	s := agent.NewSettings()
	// The host has no user `user`: run as root with the temp dir as workdir.
	// HOME is the temp dir too, so login shells read none of the host's
	// dotfiles (a host profile that takes locks, like pyenv's, would make
	// the tests depend on the machine).
	s.Init("root", dir, map[string]string{"CELLFORK_GLOBAL": "g", "HOME": dir})
	h := New(s, netip.Addr{}, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { poll(t, "no leaked child processes", func() bool { return len(children()) == 0 }) })
	t.Cleanup(h.Close)
	return &env{
		t: t, dir: dir, settings: s, srv: srv,
		proc: processconnect.NewProcessClient(srv.Client(), srv.URL, connect.WithProtoJSON()),
		fs:   filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, connect.WithProtoJSON()),
	}
}

// children returns the live (non-zombie) child processes of the test.
func children() []string {
	var out []string
	self := strconv.Itoa(os.Getpid())
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may contain spaces.
		fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(fields) > 1 && fields[1] == self && fields[0] != "Z" {
			out = append(out, f)
		}
	}
	return out
}

// asUser sets the user-selection header the SDK sends.
func asUser(h http.Header, name string) {
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(name+":")))
}

// poll retries cond until it holds or the deadline passes.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", code)
	}
	if got := connect.CodeOf(err); got != code {
		t.Fatalf("got %v (%v), want %v", got, err, code)
	}
}

func init() {
	// Not the agent's /run on the host running the tests.
	watchBarrierRoot = filepath.Join(os.TempDir(), "cellfork-envd-test-barriers")
}
