package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/netns/netnstest"
)

// echoed decodes what the fake internet's /echo answered (printed by a
// command in the sandbox), or fails with what was printed instead.
func echoed(t *testing.T, what, out string) netnstest.Echo {
	t.Helper()
	var e netnstest.Echo
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &e); err != nil {
		t.Fatalf("%s: not an echo: %q", what, out)
	}
	return e
}

// sh runs a shell command in the sandbox as its default user and returns
// stdout, failing on a non-zero exit.
func sh(t *testing.T, sb sandboxInfo, cmd string) string {
	t.Helper()
	out, errOut, code := run(t, sb, "", cmd)
	if code != 0 {
		t.Fatalf("%s: exit %d: %s %s", cmd, code, out, errOut)
	}
	return out
}

// filesWith returns the files under dir holding needle, except skip.
func filesWith(t *testing.T, dir string, needle []byte, skip func(string) bool) []string {
	t.Helper()
	var hits []string
	_ = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !e.Type().IsRegular() || skip(p) {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, needle) {
			hits = append(hits, p)
		}
		return nil
	})
	return hits
}

// Network rules with a real sandbox: curl, Python's requests (pip's copy)
// and urllib reach a ruled host with the rule's headers; a host without a
// rule gets none; allowOut still decides; the value never enters the
// sandbox (environment, files), the API's answers, the daemon's log or
// its data directory (snapshot images included); rules survive a
// snapshot, and an update gives them (and the CA) to a running sandbox.
func TestNetworkRules(t *testing.T) {
	netnstest.FakeInternet(t)
	const secret = "Bearer sk-cellfork-test-7f3a9c1e5b"
	const other = "other-secret-0d8e2f"
	sb := create(t, map[string]any{"network": map[string]any{
		"allowOut": []string{"allowed.test", "www.allowed.test"}, "denyOut": []string{"0.0.0.0/0"},
		"rules": map[string]any{
			"allowed.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"Authorization": secret, "X-Team": "t1"}}}},
			"other.test":   []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"X-Other": other}}}},
		},
	}})

	// curl (the system bundle), requests (REQUESTS_CA_BUNDLE), urllib
	// (OpenSSL's defaults), each sending an Authorization of its own.
	clients := map[string]string{
		"curl": `curl -sS --max-time 10 -H 'Authorization: mine' https://allowed.test/echo`,
		"requests": `python3 -c 'from pip._vendor import requests
print(requests.get("https://allowed.test/echo", headers={"Authorization": "mine"}, timeout=10).text)'`,
		"urllib": `python3 -c 'import urllib.request as u
print(u.urlopen(u.Request("https://allowed.test/echo", headers={"Authorization": "mine"}), timeout=10).read().decode())'`,
	}
	for name, cmd := range clients {
		e := echoed(t, name, sh(t, sb, cmd))
		ok := len(e.Headers["Authorization"]) == 1 && e.Headers.Get("Authorization") == netnstest.Digest(secret) && e.Headers.Get("X-Team") == netnstest.Digest("t1") && e.SNI == "allowed.test"
		record("egress rules", name+" to a ruled host", "the rule's headers, the sandbox's replaced", fmt.Sprint(ok), ok)
		if !ok {
			t.Errorf("%s: the host saw %+v", name, e)
		}
	}
	// The code interpreter's processes trust the CA too.
	ev := runCode(t, sb, `from pip._vendor import requests
print(requests.get("https://allowed.test/echo", timeout=10).text)`)
	out := stdoutOf(ev)
	if strings.TrimSpace(out) == "" {
		t.Fatalf("run_code printed nothing: %v", ev)
	}
	if e := echoed(t, "run_code", out); e.Headers.Get("Authorization") != netnstest.Digest(secret) {
		t.Errorf("run_code: the host saw %+v", e.Headers)
	}

	// A host without a rule: untouched (its own certificate, no headers).
	e := echoed(t, "no rule", sh(t, sb, `curl -sS -k --max-time 10 https://www.allowed.test/echo`))
	if e.Headers.Get("Authorization") != "" || e.Headers.Get("X-Team") != "" || e.Headers.Get("X-Other") != "" {
		t.Errorf("a host without a rule got headers: %+v", e.Headers)
	}
	// Plain HTTP to the ruled host: never transformed.
	e = echoed(t, "plain HTTP", sh(t, sb, `curl -sS --max-time 10 http://allowed.test/echo`))
	if e.Headers.Get("Authorization") != "" {
		t.Errorf("plain HTTP got the secret: %+v", e.Headers)
	}
	// A rule opens nothing: other.test is ruled but not allowed.
	got, _, code := run(t, sb, "", `curl -sS --max-time 10 --resolve other.test:443:`+netnstest.OtherIP+` https://other.test/echo`)
	record("egress rules", "reach a ruled host allowOut does not allow", "refused", fmt.Sprintf("curl exit %d %s", code, got), code != 0)
	if code == 0 {
		t.Errorf("a rule opened other.test: %s", got)
	}

	// The value is not in the sandbox: its environment, its processes',
	// its writable files. The CA is in the bundle, once.
	envs := sh(t, sb, `env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n'`)
	// (The patterns end in "." so that the grep's own arguments, in the
	// sandbox's memory, are not the values the snapshot images below are
	// searched for.)
	files, _, _ := run(t, sb, "root", `grep -rIl --exclude-dir=proc --exclude-dir=sys -e '`+secret[:len(secret)-1]+`.' -e '`+
		other[:len(other)-1]+`.' /etc /home /root /tmp /run /var /usr/local /opt 2>/dev/null; true`)
	inside := strings.Contains(envs, secret) || strings.Contains(envs, other) || strings.TrimSpace(files) != ""
	record("egress rules", "find a rule's header value inside the sandbox (env, processes, files)", "absent", fmt.Sprintf("found=%v %s", inside, files), !inside)
	if inside {
		t.Errorf("the secret is inside the sandbox: files %q", files)
	}
	if !strings.Contains(envs, "REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt") || !strings.Contains(envs, "NODE_EXTRA_CA_CERTS=") {
		t.Errorf("the CA variables are not set: %s", envs)
	}
	trusted := func(sb sandboxInfo) string {
		return strings.TrimSpace(sh(t, sb, `grep -c 'cellfork egress CA' /etc/ssl/certs/ca-certificates.crt`))
	}
	if n := trusted(sb); n != "1" {
		t.Errorf("the CA is in the bundle %s times", n)
	}

	// The API reports domains and header names, never the values.
	for _, path := range []string{"/sandboxes/" + sb.SandboxID, "/sandboxes/" + sb.SandboxID + "/network"} {
		r := call(t, "GET", path, nil)
		leak := bytes.Contains(r.body, []byte(secret)) || bytes.Contains(r.body, []byte(other))
		reported := string(r.body)
		if i := strings.Index(reported, `"rules":`); i >= 0 {
			reported = reported[i:]
		}
		record("egress rules", "read a rule's header value through GET "+strings.Replace(path, sb.SandboxID, "{id}", 1), "redacted",
			fmt.Sprintf("value returned: %v; %s", leak, reported), !leak)
		if leak || !bytes.Contains(r.body, []byte(`"Authorization":"[redacted]"`)) {
			t.Errorf("GET %s: %s", path, r.body)
		}
	}

	// A snapshot carries the rules; a sandbox made from it (a new hand-off)
	// keeps one copy of the CA.
	sid := snapshotOf(t, sb.SandboxID, "")
	fromSnap := create(t, map[string]any{"templateID": sid})
	if e := echoed(t, "from snapshot", sh(t, fromSnap, clients["curl"])); e.Headers.Get("Authorization") != netnstest.Digest(secret) {
		t.Errorf("sandbox from the snapshot: the host saw %+v", e.Headers)
	}
	if n := trusted(fromSnap); n != "1" {
		t.Errorf("from the snapshot the CA is in the bundle %s times", n)
	}

	// Rules given at runtime to a sandbox without any (internet on).
	open := create(t, nil)
	r := call(t, "PUT", "/sandboxes/"+open.SandboxID+"/network", map[string]any{
		"rules": map[string]any{"*.allowed.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"X-Late": secret}}}}}})
	if r.status != http.StatusNoContent {
		t.Fatalf("update with rules: %d %s", r.status, r.body)
	}
	if e := echoed(t, "updated", sh(t, open, `curl -sS --max-time 10 https://www.allowed.test/echo`)); e.Headers.Get("X-Late") != netnstest.Digest(secret) {
		t.Errorf("rules given by an update: the host saw %+v", e.Headers)
	}
	if e := echoed(t, "updated, other host", sh(t, open, `curl -sS -k --max-time 10 https://other.test/echo`)); e.Headers.Get("X-Late") != "" {
		t.Errorf("a host without a rule got headers after an update: %+v", e.Headers)
	}

	// Nothing of the daemon's holds the value but its store: not its log,
	// not the agents' logs, bundles or snapshot images.
	hits := filesWith(t, d.dataDir, []byte(secret), func(p string) bool { return strings.HasPrefix(filepath.Base(p), "state.db") })
	inLog := strings.Contains(d.logs(), secret) || strings.Contains(d.logs(), other)
	record("egress rules", "find a rule's header value in the daemon's log or data directory (snapshot images, logs)", "only in its store",
		fmt.Sprintf("log=%v files=%v", inLog, hits), !inLog && len(hits) == 0)
	if inLog || len(hits) > 0 {
		t.Errorf("the secret leaked: in the log %v, in %v", inLog, hits)
	}
}

// maskRequestHost: a server in the sandbox sees the mask as Host, the
// caller's host in X-Forwarded-Host; envd is not masked.
func TestMaskRequestHost(t *testing.T) {
	sb := create(t, map[string]any{"network": map[string]any{"maskRequestHost": "${PORT}-masked.example.com"}})
	server := `import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.headers.get("Host", "") + "|" + self.headers.get("X-Forwarded-Host", "")).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()
`
	sh(t, sb, "cat > /tmp/host.py <<'EOF'\n"+server+"EOF\nnohup python3 /tmp/host.py >/dev/null 2>&1 &")
	h := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "8000"}
	var r response
	eventually(t, 20*time.Second, "the server in the sandbox", func() bool {
		r = dataCall(t, "GET", "/", h, nil)
		return r.status == 200
	})
	want := "8000-masked.example.com|" + strings.TrimPrefix(d.url, "http://")
	if string(r.body) != want {
		t.Errorf("the server saw %q, want %q", r.body, want)
	}
	if v, _ := info(t, sb.SandboxID)["network"].(map[string]any); v["maskRequestHost"] != "${PORT}-masked.example.com" {
		t.Errorf("get_info network: %v", v)
	}
	// An update keeps it (ingress is the create's).
	if r := call(t, "PUT", "/sandboxes/"+sb.SandboxID+"/network", map[string]any{}); r.status != http.StatusNoContent {
		t.Fatalf("update: %d %s", r.status, r.body)
	}
	if r := dataCall(t, "GET", "/", h, nil); string(r.body) != want {
		t.Errorf("after an update the server saw %q", r.body)
	}
	// envd still answers (its Host is never masked).
	if out := sh(t, sb, "echo ok"); strings.TrimSpace(out) != "ok" {
		t.Errorf("envd: %q", out)
	}
}
