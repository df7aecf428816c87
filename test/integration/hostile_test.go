package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/envd/process"
	"github.com/cellfork/cellfork/internal/envd/process/processconnect"
)

// TestMemoryBombIsContained: a sandbox that exceeds its memory limit dies
// alone; the daemon notices at once, frees it, and says why; a neighbour
// keeps answering.
func TestMemoryBombIsContained(t *testing.T) {
	neighbour := create(t, nil)
	bomb := create(t, map[string]any{"memoryMB": 256})
	rid := runtimeID(t, bomb.SandboxID)
	done := make(chan struct{})
	go func() {
		defer close(done)
		body := `{"code":"x = bytearray(1 << 30)","context_id":null,"language":null,"env_vars":null}`
		h := map[string]string{"E2b-Sandbox-Id": bomb.SandboxID, "E2b-Sandbox-Port": "49999", "X-Access-Token": bomb.EnvdAccessToken}
		dataCall(t, "POST", "/execute", h, strings.NewReader(body))
	}()
	eventually(t, 30*time.Second, "the daemon to report the sandbox dead", func() bool {
		r := call(t, "GET", "/sandboxes/"+bomb.SandboxID, nil)
		return r.status == 404 && strings.Contains(r.errMessage(), "memory limit")
	})
	record("inside a sandbox", "memory bomb (1 GiB in a 256 MiB sandbox)", "only that sandbox ends; reported", "ended, reported: exceeded its memory limit", true)
	<-done
	r := dataCall(t, "GET", "/health", map[string]string{"E2b-Sandbox-Id": bomb.SandboxID, "E2b-Sandbox-Port": "49983"}, nil)
	if r.status != 502 || !strings.Contains(r.errMessage(), "was not found") || !strings.Contains(r.errMessage(), "memory limit") {
		t.Errorf("data plane after the death: %d %s", r.status, r.body)
	}
	if got := stdoutOf(runCode(t, neighbour, "print('fine')")); got != "fine\n" {
		t.Errorf("neighbour: %q", got)
	}
	eventually(t, 10*time.Second, "the dead sandbox's resources to be freed", func() bool { return len(leftovers(t, rid)) == 0 })
}

// TestHostileInside: each attack runs in a fresh sandbox and fails inside
// it: a fork bomb, exhausting file descriptors, filling the disk,
// signalling the agent. The sandbox (its agent, its REPL) and a neighbour
// keep answering.
func TestHostileInside(t *testing.T) {
	neighbour := create(t, nil)
	alive := func(sb sandboxInfo, what string) {
		t.Helper()
		if got := stdoutOf(runCode(t, sb, "print('ok')")); got != "ok\n" {
			t.Errorf("after %s the sandbox's REPL answers %q", what, got)
		}
		if out, _, code := run(t, sb, "root", "echo ok"); out != "ok\n" || code != 0 {
			t.Errorf("after %s commands answer %q (%d)", what, out, code)
		}
		if got := stdoutOf(runCode(t, neighbour, "print('ok')")); got != "ok\n" {
			t.Errorf("after %s the neighbour answers %q", what, got)
		}
	}

	t.Run("fork bomb stops at the process limit", func(t *testing.T) {
		sb := create(t, nil)
		out, _, _ := run(t, sb, "", `timeout 15 bash -c 'b(){ b|b& }; b' 2>&1 | grep -c -m1 "Resource temporarily unavailable"`)
		run(t, sb, "root", "pkill -9 -u user; true")
		record("inside a sandbox", "fork bomb", "refused by the process limit", "EAGAIN seen: "+strings.TrimSpace(out), strings.TrimSpace(out) == "1")
		if strings.TrimSpace(out) != "1" {
			t.Errorf("fork bomb was not refused by the process limit: %q", out)
		}
		alive(sb, "a fork bomb")
	})

	t.Run("file descriptors run out for the hoarder", func(t *testing.T) {
		sb := create(t, nil)
		ev := runCode(t, sb, `
import errno
fs = []
try:
    while True:
        fs.append(open('/dev/null'))
except OSError as e:
    print(errno.errorcode[e.errno], len(fs) > 1000)
finally:
    for f in fs: f.close()
`)
		record("inside a sandbox", "exhaust file descriptors", "EMFILE", stdoutOf(ev), stdoutOf(ev) == "EMFILE True\n")
		if got := stdoutOf(ev); got != "EMFILE True\n" {
			t.Errorf("fd exhaustion: %q %v", got, ev)
		}
		alive(sb, "exhausting file descriptors")
	})

	t.Run("filling the root filesystem fails with ENOSPC", func(t *testing.T) {
		sb := create(t, nil)
		out, _, _ := run(t, sb, "", "dd if=/dev/zero of=/home/user/fill bs=1M count=4096 2>&1 | grep -c 'No space left on device'")
		record("inside a sandbox", "fill the root filesystem", "ENOSPC", "ENOSPC seen: "+strings.TrimSpace(out), strings.TrimSpace(out) == "1")
		if strings.TrimSpace(out) != "1" {
			t.Errorf("filling the root filesystem: %q", out)
		}
		alive(sb, "filling the root filesystem")
	})
	// /tmp is on the root overlay and /dev/shm is a tmpfs of half its
	// size: filling either fails with ENOSPC, and the sandbox lives on.
	for _, dir := range []string{"/tmp", "/dev/shm"} {
		t.Run("filling "+dir+" fails with ENOSPC", func(t *testing.T) {
			sb := create(t, nil)
			out, _, _ := run(t, sb, "", "dd if=/dev/zero of="+dir+"/fill bs=1M count=8192 2>&1 | grep -c 'No space left on device'")
			record("inside a sandbox", "fill "+dir, "ENOSPC", "ENOSPC seen: "+strings.TrimSpace(out), strings.TrimSpace(out) == "1")
			if strings.TrimSpace(out) != "1" {
				t.Errorf("filling %s: %q", dir, out)
			}
			alive(sb, "filling "+dir)
		})
	}

	t.Run("the user cannot signal the agent", func(t *testing.T) {
		sb := create(t, nil)
		out, _, _ := run(t, sb, "", "kill -9 1 2>&1; kill -STOP 1 2>&1; kill -TERM 1 2>&1; true")
		record("inside a sandbox", "user sends SIGKILL/SIGSTOP/SIGTERM to the agent", "EPERM", out, strings.Count(out, "not permitted") == 3)
		if strings.Count(out, "not permitted") != 3 {
			t.Errorf("signals at the agent from the user: %q", out)
		}
		alive(sb, "signals at the agent")
	})

	// Root inside a sandbox can end it (gVisor does not shield a
	// namespace's init from SIGKILL): the daemon notices at once and says
	// so; the neighbour does not care.
	t.Run("root ending its own sandbox is noticed", func(t *testing.T) {
		sb := create(t, nil)
		h := envdHeaders(sb)
		h["Authorization"] = "Basic " + b64("root:")
		client := processconnect.NewProcessClient(&http.Client{Transport: headerTransport{h}}, d.url, connect.WithProtoJSON())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if stream, err := client.Start(ctx, connect.NewRequest(&process.StartRequest{
			Process: &process.ProcessConfig{Cmd: "/bin/kill", Args: []string{"-9", "1"}},
		})); err == nil {
			for stream.Receive() { // the stream breaks as the sandbox ends
			}
		}
		eventually(t, 10*time.Second, "the daemon to report the sandbox gone", func() bool {
			r := call(t, "GET", "/sandboxes/"+sb.SandboxID, nil)
			return r.status == 404 && strings.Contains(r.errMessage(), "died")
		})
		record("inside a sandbox", "root SIGKILLs the agent (pid 1)", "only that sandbox ends; reported", "ended, reported as died", true)
		if got := stdoutOf(runCode(t, neighbour, "print('ok')")); got != "ok\n" {
			t.Errorf("neighbour after root killed its own sandbox: %q", got)
		}
	})
}

// TestIdleAndSlowClients: thousands of idle connections and a client that
// sends its headers a byte at a time do not keep the daemon from answering
// others promptly. (The server cuts header reads off after 10 s.)
func TestIdleAndSlowClients(t *testing.T) {
	addr := strings.TrimPrefix(d.url, "http://")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 2000 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("opening idle connection %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	go func() {
		for _, b := range []byte("GET /health HTTP/1.1\r\nHost: x\r\n") {
			if _, err := slow.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	start := time.Now()
	if r := call(t, "GET", "/v2/sandboxes", nil); r.status != 200 {
		t.Fatalf("list with 2000 idle connections open: %d", r.status)
	}
	took := time.Since(start)
	record("API clients", "2000 idle connections + a byte-a-second client", "others answered within 2 s", took.Round(time.Millisecond).String(), took <= 2*time.Second)
	if took > 2*time.Second {
		t.Errorf("the daemon took %v to answer with 2000 idle connections open", took)
	}
	sb := create(t, nil)
	if got := stdoutOf(runCode(t, sb, "print('ok')")); got != "ok\n" {
		t.Errorf("data plane with idle connections open: %q", got)
	}
}

// POST /init sets a sandbox's environment and process limits: only the
// daemon may, not code inside the sandbox and not the daemon's clients.
func TestInitIsTheDaemons(t *testing.T) {
	sb := create(t, map[string]any{"pidsMax": 128})
	got := strings.TrimSpace(stdoutOf(runCode(t, sb, `
import urllib.request, urllib.error
req = urllib.request.Request("http://127.0.0.1:49983/init", data=b'{"pidsMax": 100000, "openFiles": 1000000}', method="POST")
try:
    print(urllib.request.urlopen(req, timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code)
import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[1])`)))
	record("limits", "raise the sandbox's process limit by POST /init from inside", "403, limit kept", got, got == "403\n128")
	if got != "403\n128" {
		t.Errorf("POST /init from inside: %q", got)
	}
	r := dataCall(t, "POST", "/init", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983",
		"X-Access-Token": sb.EnvdAccessToken}, strings.NewReader(`{"pidsMax": 100000}`))
	record("limits", "POST /init through the daemon with the access token", "403", fmt.Sprint(r.status), r.status == 403)
	if r.status != 403 {
		t.Errorf("POST /init through the daemon: %d %s", r.status, r.body)
	}
}

// Orphans (background processes outliving their shell) are adopted by the
// agent, PID 1 of the sandbox, which must reap them: zombies would hold
// pids against the sandbox's process limit until it could start nothing.
func TestOrphansAreReaped(t *testing.T) {
	sb := create(t, nil)
	for range 5 {
		run(t, sb, "", "sleep 0.1 >/dev/null 2>&1 &")
	}
	eventually(t, 10*time.Second, "no zombies in the sandbox", func() bool {
		out, _, _ := run(t, sb, "", "ps -eo stat= | grep -c '^Z' || true")
		return strings.TrimSpace(out) == "0"
	})
}
