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
		{"allowOut": []string{"*.*"}}, {"denyOut": []string{"not an address"}},
		{"denyOut": []string{"example.com"}}, {"allowOut": []string{"::1"}}, {"dnsServers": []string{"dns.google"}},
		{"egressProxy": map[string]any{"address": "proxy.example:1080"}},
	} {
		r := call(t, "PUT", "/sandboxes/"+open.SandboxID+"/network", bad)
		record("egress policy", fmt.Sprintf("policy %v", bad), "400", fmt.Sprintf("%d %s", r.status, r.errMessage()), r.status == 400)
		if r.status != 400 || r.errMessage() == "" {
			t.Errorf("bad policy %v: %d %s", bad, r.status, r.body)
		}
	}
	if r := call(t, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{"bad name"}}}); r.status != 400 {
		t.Errorf("create with a malformed rule: %d", r.status)
	}
}

// fetch runs one HTTP(S) request from inside the sandbox: to ip (or, if
// ip is "", to host by name), port 80 or 443, naming host in the Host
// header and the TLS server name. It returns the body, or the error's
// class name.
func fetch(t *testing.T, sb sandboxInfo, ip, host string, overTLS bool) string {
	t.Helper()
	code := fmt.Sprintf(`
import http.client, ssl, socket
ip, host, tls = %q, %q, %s
class Conn(http.client.HTTPSConnection if tls else http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.create_connection((ip or host, self.port), 5)
        if tls:
            ctx = ssl._create_unverified_context()
            self.sock = ctx.wrap_socket(self.sock, server_hostname=host)
try:
    c = Conn(host, timeout=5) if not tls else Conn(host, timeout=5, context=ssl._create_unverified_context())
    c.request("GET", "/", headers={"Host": host})
    print(c.getresponse().read().decode())
except Exception as e:
    print(type(e).__name__)
`, ip, host, map[bool]string{false: "False", true: "True"}[overTLS])
	return strings.TrimSpace(stdoutOf(runCode(t, sb, code)))
}

func TestDomainRules(t *testing.T) {
	netnstest.FakeInternet(t)
	const allowedIP = "203.0.113.10"
	open := create(t, nil)
	got := strings.TrimSpace(stdoutOf(runCode(t, open, `import socket; print(socket.gethostbyname("other.test"))`)))
	record("egress policy", "resolve a name with the internet on", netnstest.OtherIP, got, got == netnstest.OtherIP)
	if got != netnstest.OtherIP {
		t.Errorf("internet on: other.test resolves to %q", got)
	}

	sb := create(t, map[string]any{"network": map[string]any{"allowOut": []string{"allowed.test"}, "denyOut": []string{"0.0.0.0/0"}}})
	for _, overTLS := range []bool{false, true} {
		proto := map[bool]string{false: "HTTP", true: "HTTPS"}[overTLS]
		if got := fetch(t, sb, "", "allowed.test", overTLS); got != "allowed.test at "+allowedIP {
			t.Errorf("%s to an allowed name: %q", proto, got)
		}
		got := fetch(t, sb, netnstest.OtherIP, "other.test", overTLS)
		record("egress policy", proto+" to a name no domain rule allows (dialled by address)", "refused", got, !strings.Contains(got, " at "))
		if strings.Contains(got, " at ") {
			t.Errorf("%s to other.test got through: %q", proto, got)
		}
		got = fetch(t, sb, netnstest.OtherIP, "allowed.test", overTLS)
		record("egress policy", proto+" naming an allowed domain while dialling another address",
			"reaches the allowed domain's own address", got, got == "allowed.test at "+allowedIP)
		if got != "allowed.test at "+allowedIP {
			t.Errorf("%s naming allowed.test at another address: %q", proto, got)
		}
		got = fetch(t, sb, allowedIP, allowedIP, overTLS)
		record("egress policy", proto+" to an allowed domain's address with no name", "refused", got, !strings.Contains(got, " at "))
		if strings.Contains(got, " at ") {
			t.Errorf("%s to a bare address got through: %q", proto, got)
		}
	}
	got = strings.TrimSpace(stdoutOf(runCode(t, sb, `
import socket
try: print(socket.gethostbyname("other.test"))
except OSError as e: print(type(e).__name__)`)))
	record("egress policy", "resolve a name no domain rule allows", "refused", got, got == "gaierror")
	if got != "gaierror" {
		t.Errorf("other.test resolved in a closed sandbox: %q", got)
	}
	if got := reach(t, sb, netnstest.PublicAddr); got == "hi" {
		t.Error("a domain rule opened a port other than 80 and 443")
	}
	if n := denied(t, sb.SandboxID); n < 4 {
		t.Errorf("denied connections = %v after at least four refusals", n)
	}

	// Fork children inherit domain rules; PUT replaces them.
	var kids []struct {
		Sandbox *sandboxInfo `json:"sandbox"`
	}
	call(t, "POST", "/sandboxes/"+sb.SandboxID+"/fork", map[string]any{"count": 1}).json(t, &kids)
	if len(kids) != 1 || kids[0].Sandbox == nil {
		t.Fatal("fork failed")
	}
	kid := *kids[0].Sandbox
	t.Cleanup(func() { killQuietly(kid.SandboxID) })
	if got := fetch(t, kid, netnstest.OtherIP, "other.test", true); strings.Contains(got, " at ") {
		t.Errorf("fork child escaped its parent's domain rules: %q", got)
	}
	if got := fetch(t, kid, "", "allowed.test", true); got != "allowed.test at "+allowedIP {
		t.Errorf("fork child lost its parent's domain rules: %q", got)
	}
	r := call(t, "PUT", "/sandboxes/"+sb.SandboxID+"/network", map[string]any{"allowOut": []string{"*.test"}, "allow_internet_access": false})
	if r.status != http.StatusNoContent {
		t.Fatalf("update network: %d %s", r.status, r.body)
	}
	if got := fetch(t, sb, "", "other.test", true); got != "other.test at "+netnstest.OtherIP {
		t.Errorf("after allowing *.test: %q", got)
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
	record("ingress", "reach a private port without the traffic token", "403", fmt.Sprintf("%d %s", r.status, r.errMessage()), r.status == 403)
	if r.status != 403 || !strings.Contains(r.errMessage(), "is missing") {
		t.Errorf("private port without the token: %d %s", r.status, r.body)
	}
	h["E2b-Traffic-Access-Token"] = "wrong"
	r = dataCall(t, "GET", "/", h, nil)
	record("ingress", "reach a private port with a wrong traffic token", "403", fmt.Sprintf("%d %s", r.status, r.errMessage()), r.status == 403)
	if r.status != 403 || !strings.Contains(r.errMessage(), "is invalid") {
		t.Errorf("private port with a wrong token: %d %s", r.status, r.body)
	}
}
