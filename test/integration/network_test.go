package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/netns/netnstest"
)

// reach tries a TCP connection from inside the sandbox and says what
// happened: "hi" (the test host answered) or the error's class name.
func reach(t *testing.T, sb sandboxInfo, addr string) string {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	code := fmt.Sprintf(`
import socket, time
s = socket.socket(); s.settimeout(3); t0 = time.time()
try:
    s.connect((%q, %s)); print(s.recv(2).decode())
except OSError as e:
    print(type(e).__name__, round(time.time() - t0, 2))
`, host, port)
	return strings.TrimSpace(stdoutOf(runCode(t, sb, code)))
}

func denied(t *testing.T, id string) float64 {
	t.Helper()
	var st struct {
		Denied float64 `json:"deniedConnections"`
	}
	call(t, "GET", "/sandboxes/"+id+"/network", nil).json(t, &st)
	return st.Denied
}

func TestNetworkPolicy(t *testing.T) {
	netnstest.FakeInternet(t)
	open := create(t, nil)
	if got := reach(t, open, netnstest.PublicAddr); got != "hi" {
		t.Fatalf("default policy (internet on) cannot reach a public host: %s", got)
	}
	got := reach(t, open, netnstest.PrivateAddr)
	record("egress policy", "reach a private address not allowed", "refused", got, got != "hi")
	if got == "hi" {
		t.Error("a private range was reachable without being allowed")
	}

	closed := create(t, map[string]any{"allow_internet_access": false})
	got = reach(t, closed, netnstest.PublicAddr)
	record("egress policy", "reach a public host with internet off", "refused at once", got, got != "hi" && strings.HasPrefix(got, "Connection"))
	if got == "hi" || !strings.HasPrefix(got, "Connection") {
		t.Errorf("internet off: %s (want a refusal, at once)", got)
	}
	if n := denied(t, closed.SandboxID); n < 1 {
		t.Errorf("denied connections = %v after a refused attempt", n)
	}
	if info(t, closed.SandboxID)["allowInternetAccess"] != false {
		t.Error("get_info does not report allowInternetAccess false")
	}

	// Changed at runtime: allow exactly the test host.
	r := call(t, "PUT", "/sandboxes/"+closed.SandboxID+"/network", map[string]any{"allowOut": []string{"203.0.113.10"}, "allow_internet_access": false})
	if r.status != http.StatusNoContent {
		t.Fatalf("update network: %d %s", r.status, r.body)
	}
	if got := reach(t, closed, netnstest.PublicAddr); got != "hi" {
		t.Errorf("after allowOut: %s", got)
	}

	// Policies survive snapshot (create from it), fork, pause and rollback.
	sid := snapshotOf(t, closed.SandboxID, "")
	r = call(t, "PUT", "/sandboxes/"+closed.SandboxID+"/network", map[string]any{"denyOut": []string{"203.0.113.0/24"}})
	if r.status != http.StatusNoContent {
		t.Fatalf("update network: %d %s", r.status, r.body)
	}
	if got := reach(t, closed, netnstest.PublicAddr); got == "hi" {
		t.Error("denyOut did not take effect")
	}
	fromSnap := create(t, map[string]any{"templateID": sid})
	if got := reach(t, fromSnap, netnstest.PublicAddr); got != "hi" {
		t.Errorf("sandbox from the snapshot lost the snapshot's policy: %s", got)
	}
	var kids []struct {
		Sandbox *sandboxInfo `json:"sandbox"`
	}
	call(t, "POST", "/sandboxes/"+closed.SandboxID+"/fork", map[string]any{"count": 1}).json(t, &kids)
	if len(kids) != 1 || kids[0].Sandbox == nil {
		t.Fatal("fork failed")
	}
	kid := *kids[0].Sandbox
	t.Cleanup(func() { killQuietly(kid.SandboxID) })
	got = reach(t, kid, netnstest.PublicAddr)
	record("egress policy", "fork child reaches what its parent's denyOut refuses", "refused", got, got != "hi")
	if got == "hi" {
		t.Error("fork child did not inherit the parent's denyOut")
	}
	call(t, "POST", "/sandboxes/"+closed.SandboxID+"/pause", map[string]any{"spill": true})
	call(t, "POST", "/v2/sandboxes/"+closed.SandboxID+"/connect", map[string]any{})
	if got := reach(t, closed, netnstest.PublicAddr); got == "hi" {
		t.Error("policy lost across pause to disk")
	}
	call(t, "POST", "/sandboxes/"+closed.SandboxID+"/rollback", map[string]string{"snapshotID": sid})
	if got := reach(t, closed, netnstest.PublicAddr); got == "hi" {
		t.Error("policy lost across rollback (the sandbox's policy, not the snapshot's, applies)")
	}

	for _, bad := range []map[string]any{
		{"allowOut": []string{"*.example.com"}}, {"denyOut": []string{"not an address"}},
		{"allowOut": []string{"::1"}}, {"dnsServers": []string{"1.1.1.1"}},
	} {
		r := call(t, "PUT", "/sandboxes/"+open.SandboxID+"/network", bad)
		record("egress policy", fmt.Sprintf("policy %v", bad), "400", fmt.Sprintf("%d %s", r.status, r.errMessage()), r.status == 400)
		if r.status != 400 || r.errMessage() == "" {
			t.Errorf("bad policy %v: %d %s", bad, r.status, r.body)
		}
	}
	if r := call(t, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{"*.x"}}}); r.status != 400 {
		t.Errorf("create with a domain rule: %d", r.status)
	}
}

func TestPrivatePorts(t *testing.T) {
	sb := create(t, map[string]any{"network": map[string]any{"allowPublicTraffic": false}})
	run(t, sb, "", "cd /tmp && nohup python3 -m http.server 8000 >/dev/null 2>&1 &")
	h := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "8000"}
	eventually(t, 15*time.Second, "the server to answer with the traffic token", func() bool {
		h["E2b-Traffic-Access-Token"] = sb.EnvdAccessToken
		return dataCall(t, "GET", "/", h, nil).status == 200
	})
	delete(h, "E2b-Traffic-Access-Token")
	r := dataCall(t, "GET", "/", h, nil)
	record("ingress", "reach a private port without the traffic token", "401", fmt.Sprintf("%d %s", r.status, r.errMessage()), r.status == 401)
	if r.status != 401 || !strings.Contains(r.errMessage(), "private") {
		t.Errorf("private port without the token: %d %s", r.status, r.body)
	}
}
