package integration

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestBadInputControlPlane: every bad request gets a 4xx JSON error with a
// message, never a 5xx or a hang.
func TestBadInputControlPlane(t *testing.T) {
	cases := []struct {
		name, method, path string
		body               any
		headers            map[string]string
		want               int
	}{
		{"malformed JSON", "POST", "/v2/sandboxes", `{"templateID": `, nil, 400},
		{"wrong JSON type", "POST", "/v2/sandboxes", `{"templateID": 5}`, nil, 400},
		{"missing templateID", "POST", "/v2/sandboxes", `{}`, nil, 400},
		{"unknown template", "POST", "/v2/sandboxes", `{"templateID":"no-such-template"}`, nil, 404},
		{"negative timeout", "POST", "/v2/sandboxes", `{"templateID":"base","timeout":-5}`, nil, 400},
		{"timeout over max", "POST", "/v2/sandboxes", `{"templateID":"base","timeout":99999999}`, nil, 400},
		{"too many cpus", "POST", "/v2/sandboxes", `{"templateID":"base","cpuCount":512}`, nil, 400},
		{"autoResume without autoPause", "POST", "/v2/sandboxes", `{"templateID":"base","autoResume":{"enabled":true}}`, nil, 400},
		{"env name with =", "POST", "/v2/sandboxes", `{"templateID":"base","envVars":{"A=B":"x"}}`, nil, 400},
		{"unknown sandbox get", "GET", "/sandboxes/nosuchsandbox0000000", nil, nil, 404},
		{"unknown sandbox kill", "DELETE", "/sandboxes/nosuchsandbox0000000", nil, nil, 404},
		{"unknown sandbox timeout", "POST", "/sandboxes/nosuchsandbox0000000/timeout", `{"timeout":5}`, nil, 404},
		{"unknown sandbox connect", "POST", "/v2/sandboxes/nosuchsandbox0000000/connect", `{}`, nil, 404},
		{"unknown sandbox metrics", "GET", "/sandboxes/nosuchsandbox0000000/metrics", nil, nil, 404},
		{"bad list state", "GET", "/v2/sandboxes?state=sleeping", nil, nil, 400},
		{"bad list limit", "GET", "/v2/sandboxes?limit=-1", nil, nil, 400},
		{"bad page token", "GET", "/v2/sandboxes?nextToken=!!!", nil, nil, 400},
		{"wrong API key", "GET", "/v2/sandboxes", nil, map[string]string{"X-API-KEY": "wrong"}, 401},
		{"missing API key", "GET", "/v2/sandboxes", nil, map[string]string{"X-API-KEY": ""}, 401},
		{"body too large", "POST", "/v2/sandboxes", `{"templateID":"base","metadata":{"a":"` + strings.Repeat("x", 2<<20) + `"}}`, nil, 400},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := map[string]string{"X-API-KEY": apiKey}
			for k, v := range c.headers {
				h[k] = v
			}
			r := callWith(t, c.method, c.path, c.body, h)
			record("API input (control plane)", c.name, fmt.Sprint(c.want), fmt.Sprintf("%d %s", r.status, r.errMessage()), r.status == c.want && r.errMessage() != "")
			if r.status != c.want {
				t.Errorf("status %d, want %d: %s", r.status, c.want, r.body)
			}
			if r.errMessage() == "" {
				t.Errorf("no error message in %s", r.body)
			}
		})
	}
}

func TestBadInputDataPlane(t *testing.T) {
	sb := create(t, nil)
	h := envdHeaders(sb)
	withUser := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range h {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	big := bytes.Repeat([]byte("x"), 2<<20) // over the test daemon's 1 MiB limit
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(big)
	zw.Close()
	cases := []struct {
		name, method, path string
		headers            map[string]string
		body               io.Reader
		want               int
		msg                string
	}{
		{"unknown sandbox", "GET", "/files?path=/etc/hostname", map[string]string{"E2b-Sandbox-Id": "nosuchsandbox0000000", "E2b-Sandbox-Port": "49983"}, nil, 502, "was not found"},
		{"missing access token", "GET", "/files?path=/etc/hostname", withUser(map[string]string{"X-Access-Token": ""}), nil, 401, "access token"},
		{"wrong access token", "GET", "/files?path=/etc/hostname", withUser(map[string]string{"X-Access-Token": "nope"}), nil, 401, "access token"},
		{"bad signature", "GET", "/files?path=/etc/hostname&signature=v1_bad", withUser(map[string]string{"X-Access-Token": ""}), nil, 401, "signature"},
		{"relative path, missing", "GET", "/files?path=no/such/file", h, nil, 404, ""},
		{"NUL in path", "GET", "/files?path=/etc/host%00name", h, nil, 400, ""},
		{"missing file", "GET", "/files?path=/no/such/file", h, nil, 404, ""},
		{"directory download", "GET", "/files?path=/etc", h, nil, 400, ""},
		{"unknown user", "GET", "/files?path=/etc/hostname&username=nobody-such", h, nil, 401, ""},
		{"oversized upload", "POST", "/files?path=/tmp/big", withUser(map[string]string{"Content-Type": "application/octet-stream"}), bytes.NewReader(big), 413, "limit"},
		{"oversized chunked upload", "POST", "/files?path=/tmp/big", withUser(map[string]string{"Content-Type": "application/octet-stream"}), io.MultiReader(bytes.NewReader(big)), 413, "limit"},
		{"bad gzip", "POST", "/files?path=/tmp/x", withUser(map[string]string{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}), strings.NewReader("not gzip"), 400, ""},
		{"bad port", "GET", "/", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "99999"}, nil, 400, ""},
		{"closed user port", "GET", "/", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "8123"}, nil, 502, "port is not open"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := dataCall(t, c.method, c.path, c.headers, c.body)
			record("API input (data plane)", c.name, fmt.Sprint(c.want), fmt.Sprintf("%d %s", r.status, r.errMessage()), r.status == c.want)
			if r.status != c.want {
				t.Errorf("status %d, want %d: %s", r.status, c.want, r.body)
			}
			if msg := r.errMessage(); msg == "" || !strings.Contains(msg, c.msg) {
				t.Errorf("message %q does not mention %q", msg, c.msg)
			}
		})
	}
	// A body the proxy never reads (the port is closed): requests on one
	// kept-alive connection are all answered. The server used to panic
	// after each and drop the connection (golang/go#68560).
	statuses := keptAlive(t, 3, "POST / HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: "+sb.SandboxID+
		"\r\nE2b-Sandbox-Port: 8123\r\nContent-Length: 5\r\n\r\nhello")
	got := fmt.Sprint(statuses)
	record("API input (data plane)", "body to a closed port, 3 requests on one connection", "502 502 502", got, got == "[502 502 502]")
	if got != "[502 502 502]" {
		t.Errorf("statuses on one connection: %s, want [502 502 502]", got)
	}

	// A small gzip upload works and the agent is still fine after all that.
	var small bytes.Buffer
	zw = gzip.NewWriter(&small)
	zw.Write([]byte("compressed"))
	zw.Close()
	r := dataCall(t, "POST", "/files?path=/home/user/z.txt", withUser(map[string]string{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}), &small)
	if r.status != http.StatusOK {
		t.Fatalf("gzip upload: %d %s", r.status, r.body)
	}
	if out, _, _ := run(t, sb, "", "cat /home/user/z.txt; echo; stat -c %U /home/user/z.txt"); out != "compressed\nuser\n" {
		t.Errorf("uploaded file: %q", out)
	}
}

// keptAlive sends req n times on one connection and returns the statuses
// of the answers, stopping at the first that does not come.
func keptAlive(t *testing.T, n int, req string) []int {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(d.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	var statuses []int
	for range n {
		if _, err := io.WriteString(conn, req); err != nil {
			break
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
	}
	return statuses
}
