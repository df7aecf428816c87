package integration

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// signedQuery is what the SDKs' download_url/upload_url put after /files:
// E2B's signature of path, operation, user and expiry with the sandbox's
// access token (spec §4.1).
func signedQuery(path, op, user, token string, exp int64) string {
	payload := fmt.Sprintf("%s:%s:%s:%s", path, op, user, token)
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	if exp != 0 {
		payload += ":" + strconv.FormatInt(exp, 10)
		q.Set("signature_expiration", strconv.FormatInt(exp, 10))
	}
	sum := sha256.Sum256([]byte(payload))
	q.Set("signature", "v1_"+base64.RawStdEncoding.EncodeToString(sum[:]))
	return q.Encode()
}

// TestSignedURLsOnASingleURL: a signed URL carries no sandbox id when the
// daemon is reached on one URL (E2B_SANDBOX_URL); the signature names the
// sandbox. Nothing else reaches a sandbox that way.
func TestSignedURLsOnASingleURL(t *testing.T) {
	a := create(t, nil)
	b := create(t, nil)
	run(t, a, "", "echo -n from-a > /home/user/f.txt")
	run(t, b, "", "echo -n from-b > /home/user/f.txt")

	get := func(sb sandboxInfo, path, user string, exp int64) response {
		return dataCall(t, "GET", "/files?"+signedQuery(path, "read", user, sb.EnvdAccessToken, exp), nil, nil)
	}
	// Relative and absolute paths, each routed to the sandbox that signed.
	for _, c := range []struct {
		sb   sandboxInfo
		path string
		want string
	}{{a, "f.txt", "from-a"}, {b, "f.txt", "from-b"}, {a, "/home/user/f.txt", "from-a"}} {
		r := get(c.sb, c.path, "", 0)
		ok := r.status == 200 && string(r.body) == c.want
		record("signed URLs (single URL)", "download "+c.path+" signed by "+c.sb.SandboxID, "200 "+c.want, fmt.Sprintf("%d %s", r.status, r.body), ok)
		if !ok {
			t.Errorf("signed download of %s: %d %s", c.path, r.status, r.body)
		}
	}
	if r := get(a, "f.txt", "user", time.Now().Unix()+60); r.status != 200 || string(r.body) != "from-a" {
		t.Errorf("signed download with an expiry: %d %s", r.status, r.body)
	}

	// Upload, multipart as the SDKs' upload_url expects, as root.
	body := "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"up.txt\"\r\n\r\nuploaded\r\n--B--\r\n"
	r := dataCall(t, "POST", "/files?"+signedQuery("up.txt", "write", "root", b.EnvdAccessToken, time.Now().Unix()+60),
		map[string]string{"Content-Type": "multipart/form-data; boundary=B"}, strings.NewReader(body))
	if r.status != 200 || !strings.Contains(string(r.body), `"path":"/root/up.txt"`) {
		t.Fatalf("signed upload: %d %s", r.status, r.body)
	}
	if out, _, _ := run(t, b, "root", "cat /root/up.txt"); out != "uploaded" {
		t.Errorf("uploaded file holds %q", out)
	}

	// Refusals, in envd's words and shape.
	for _, c := range []struct {
		name, method, query, want string
	}{
		{"expired signature", "GET", signedQuery("f.txt", "read", "", a.EnvdAccessToken, time.Now().Unix()-60),
			`{"code":401,"message":"signature is already expired"}`},
		{"signature with no sandbox's token", "GET", signedQuery("f.txt", "read", "", "not-a-token", 0),
			`{"code":401,"message":"invalid signature"}`},
		{"read signature used to write", "POST", signedQuery("f.txt", "read", "", a.EnvdAccessToken, 0),
			`{"code":401,"message":"invalid signature"}`},
	} {
		r := dataCall(t, c.method, "/files?"+c.query, map[string]string{"Content-Type": "application/octet-stream"}, strings.NewReader("x"))
		got := strings.TrimSpace(string(r.body))
		record("signed URLs (single URL)", c.name, "401 "+c.want, fmt.Sprintf("%d %s", r.status, got), r.status == 401 && got == c.want)
		if r.status != 401 || got != c.want {
			t.Errorf("%s: %d %s, want 401 %s", c.name, r.status, got, c.want)
		}
	}
	// A path changed after signing is not signed.
	q := signedQuery("f.txt", "read", "", a.EnvdAccessToken, 0)
	if r := dataCall(t, "GET", "/files?"+strings.Replace(q, "f.txt", "g.txt", 1), nil, nil); r.status != 401 {
		t.Errorf("a path changed after signing: %d %s", r.status, r.body)
	}
	// No signature: the control plane, which wants an API key; other
	// paths are never routed by a signature.
	for _, p := range []string{"/files?path=f.txt", "/process.Process/List?" + q, "/files/../health?" + q} {
		r := dataCall(t, "GET", p, nil, nil)
		record("signed URLs (single URL)", "GET "+p[:min(len(p), 40)]+" without routing headers", "not routed to a sandbox",
			fmt.Sprintf("%d %s", r.status, r.errMessage()), r.status == 401 || r.status == 404 || r.status == 200 && string(r.body) != "from-a")
		if r.status == 200 && string(r.body) == "from-a" {
			t.Errorf("%s reached the sandbox", p)
		}
	}
}

// TestHostRouting: the Host form get_host() returns, "{port}-{id}.{domain}",
// with or without a port after the domain, reaches the sandbox's port;
// create, get and connect answer the domain the request reached.
func TestHostRouting(t *testing.T) {
	sb := create(t, nil)
	u, _ := url.Parse(d.url)
	_, port, _ := strings.Cut(u.Host, ":")
	var got struct {
		Domain *string `json:"domain"`
	}
	for _, c := range []struct{ method, path string }{{"GET", "/sandboxes/" + sb.SandboxID}, {"POST", "/sandboxes/" + sb.SandboxID + "/connect"}} {
		var body any
		if c.method == "POST" {
			body = map[string]any{"timeout": 120}
		}
		r := call(t, c.method, c.path, body)
		r.json(t, &got)
		if got.Domain == nil || *got.Domain != "localhost:"+port {
			t.Errorf("%s %s: domain %v, want localhost:%s", c.method, c.path, got.Domain, port)
		}
	}

	// `python`, not only `python3`, as in E2B's base template.
	run(t, sb, "", "cd /tmp && echo -n page > index.html && (nohup python -m http.server 8000 >/dev/null 2>&1 &)")
	fetch := func(host string, headers map[string]string) (int, string) {
		req, _ := http.NewRequest("GET", d.url+"/index.html", nil)
		req.Host = host
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	eventually(t, 20*time.Second, "the server to answer through the Host form", func() bool {
		code, _ := fetch("8000-"+sb.SandboxID+".localhost:"+port, nil)
		return code == 200
	})
	for _, host := range []string{
		"8000-" + sb.SandboxID + ".localhost:" + port,     // what get_host gives here
		"8000-" + sb.SandboxID + ".sandboxes.example.com", // --domain behind a TLS front on 443
		"8000-" + sb.SandboxID + ".sandboxes.example.com:8443",
	} {
		code, body := fetch(host, nil)
		record("ingress", "Host "+strings.Replace(host, sb.SandboxID, "<id>", 1), "200 from the sandbox port", fmt.Sprintf("%d %s", code, body), code == 200 && body == "page")
		if code != 200 || body != "page" {
			t.Errorf("Host %s: %d %s", host, code, body)
		}
	}
	// envd through the Host form still needs the access token.
	envdHost := "49983-" + sb.SandboxID + ".sandboxes.example.com"
	if code, _ := fetch(envdHost, nil); code != 401 {
		t.Errorf("envd by Host without a token: %d, want 401", code)
	}
	if code, _ := fetch(envdHost, map[string]string{"X-Access-Token": sb.EnvdAccessToken}); code != 404 {
		t.Errorf("envd by Host with its token: %d, want envd's 404 for /index.html", code)
	}
	// A sandbox that does not exist: E2B's words exactly.
	code, body := fetch("8000-nosuchsandbox000000.localhost:"+port, nil)
	if code != 502 || !strings.Contains(body, `"message":"The sandbox was not found"`) {
		t.Errorf("unknown sandbox by Host: %d %s", code, body)
	}
}
