package integration

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
)

// TestNetworkIsolation: from inside a sandbox, the host (every address it
// has), the daemon's port, the metadata address and another sandbox's
// server are unreachable.
func TestNetworkIsolation(t *testing.T) {
	a, b := create(t, nil), create(t, nil)
	// B serves on 8000; A tries to reach it.
	run(t, b, "", "nohup python3 -m http.server 8000 >/dev/null 2>&1 &")
	u, _ := url.Parse(d.url)
	_, daemonPort, _ := net.SplitHostPort(u.Host)
	targets := []string{"169.254.169.254:80", "10.88.0.1:" + daemonPort, "10.88.0.1:22", "10.88.0.2:8000"}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.To4() == nil || ipn.IP.IsLoopback() {
			continue
		}
		targets = append(targets, net.JoinHostPort(ipn.IP.String(), daemonPort), net.JoinHostPort(ipn.IP.String(), "22"))
	}
	script := fmt.Sprintf(`
import socket
for t in %q.split():
    h, p = t.rsplit(":", 1)
    s = socket.socket(); s.settimeout(1.5)
    try:
        s.connect((h, int(p))); print("REACHED", t)
    except OSError as e:
        print("blocked", t, type(e).__name__)
    finally:
        s.close()
`, strings.Join(targets, " "))
	ev := runCode(t, a, script)
	out := stdoutOf(ev)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			record("isolation", "connect from a sandbox to "+f[1], "refused", line, f[0] == "blocked")
		}
	}
	if strings.Contains(out, "REACHED") || strings.Count(out, "blocked") != len(targets) {
		t.Fatalf("isolation broken:\n%s\n%v", out, ev)
	}
	// B's server is up: it answers through the daemon.
	eventually(t, 15e9, "B's server to answer through the proxy", func() bool {
		r := dataCall(t, "GET", "/", map[string]string{"E2b-Sandbox-Id": b.SandboxID, "E2b-Sandbox-Port": "8000"}, nil)
		return r.status == 200
	})
}
