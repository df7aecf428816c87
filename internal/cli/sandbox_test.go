package cli

import (
	"context"
	"encoding/json"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

func TestSandboxCreate(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "sandbox", "create", "--template", "py", "--timeout", "60",
		"--env", "A=1", "--env", "B=2", "--metadata", "owner=me")
	if code != 0 || out != "sbx1\n" {
		t.Fatalf("got code %d stdout %q stderr %q", code, out, errOut)
	}
	r := d.last("POST", "/v2/sandboxes")
	var body map[string]any
	if err := json.Unmarshal([]byte(r.Body), &body); err != nil {
		t.Fatal(err)
	}
	want := `{"envVars":{"A":"1","B":"2"},"metadata":{"owner":"me"},"templateID":"py","timeout":60}`
	if got, _ := json.Marshal(body); string(got) != want {
		t.Errorf("body %s, want %s", got, want)
	}
	if r.Header.Get("X-API-KEY") != testKey || r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v", r.Header)
	}
}

func TestSandboxCreateLimits(t *testing.T) {
	d := newFakeDaemon(t)
	code, _, errOut := d.run(context.Background(), "", "sandbox", "create", "--cpus", "2", "--memory-mb", "2048",
		"--disk-mb", "1024", "--pids-max", "100", "--open-files", "0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	// Only the limits given are sent, as given (0 too: the daemon refuses it).
	want := `{"templateID":"base","timeout":300,"cpuCount":2,"memoryMB":2048,"diskSizeMB":1024,"pidsMax":100,"openFiles":0}`
	if r := d.last("POST", "/v2/sandboxes"); !sameJSON(r.Body, want) {
		t.Errorf("body %s, want %s", r.Body, want)
	}
	d.run(context.Background(), "", "sandbox", "create", "--pids-max", "64")
	if r := d.last("POST", "/v2/sandboxes"); !sameJSON(r.Body, `{"templateID":"base","timeout":300,"pidsMax":64}`) {
		t.Errorf("body %s", r.Body)
	}
}

func TestSandboxCreateEgress(t *testing.T) {
	d := newFakeDaemon(t)
	code, _, errOut := d.run(context.Background(), "", "sandbox", "create", "--no-internet",
		"--allow-out", "pypi.org", "--allow-out", "10.0.0.0/8", "--deny-out", "0.0.0.0/0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := `{"templateID":"base","timeout":300,"allow_internet_access":false,"network":{"allowOut":["pypi.org","10.0.0.0/8"],"denyOut":["0.0.0.0/0"]}}`
	if r := d.last("POST", "/v2/sandboxes"); !sameJSON(r.Body, want) {
		t.Errorf("body %s, want %s", r.Body, want)
	}
}

func TestSandboxCreateDefaultsAndJSON(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, _ := d.run(context.Background(), "", "--json", "sandbox", "create")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if r := d.last("POST", "/v2/sandboxes"); r.Body != `{"templateID":"base","timeout":300}` {
		t.Errorf("body %s", r.Body)
	}
	var resp map[string]any
	if err := json.Unmarshal([]byte(out), &resp); err != nil || resp["sandboxID"] != "sbx1" || resp["envdAccessToken"] != testToken {
		t.Errorf("--json output %q (%v)", out, err)
	}
}

func TestSandboxList(t *testing.T) {
	d := newFakeDaemon(t)
	d.pages = []listPage{
		{Body: `[{"sandboxID":"a","templateID":"base","clientID":"c","state":"running","startedAt":"2026-08-22T10:00:00.123Z","endAt":"2026-08-22T10:05:00Z","cpuCount":1,"memoryMB":512,"diskSizeMB":1,"envdVersion":"0.6.13"}]`, Next: "tok1"},
		{Body: `[{"sandboxID":"b","templateID":"tpl","clientID":"c","state":"paused","startedAt":"2026-08-22T12:00:00+02:00","endAt":"2026-08-22T12:30:00.5+02:00"}]`},
	}
	code, out, errOut := d.run(context.Background(), "", "sandbox", "list", "--state", "running,paused", "--metadata", "owner=a&b", "--metadata", "k=v")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "ID  TEMPLATE  STATE    STARTED               ENDS\n" +
		"a   base      running  2026-08-22T10:00:00Z  2026-08-22T10:05:00Z\n" +
		"b   tpl       paused   2026-08-22T10:00:00Z  2026-08-22T10:30:00Z\n"
	if out != want {
		t.Errorf("table:\n%s\nwant:\n%s", out, want)
	}
	q, _ := url.ParseQuery(d.last("GET", "/v2/sandboxes").Query)
	if q.Get("state") != "running,paused" || q.Get("nextToken") != "tok1" {
		t.Errorf("query %v", q)
	}
	meta, err := url.ParseQuery(q.Get("metadata"))
	owner, _ := url.QueryUnescape(meta.Get("owner"))
	if err != nil || owner != "a&b" || meta.Get("k") != "v" || len(meta) != 2 {
		t.Errorf("metadata %q -> %v (%v)", q.Get("metadata"), meta, err)
	}

	code, out, _ = d.run(context.Background(), "", "sandbox", "list", "--json")
	var items []map[string]any
	if err := json.Unmarshal([]byte(out), &items); code != 0 || err != nil || len(items) != 2 || items[1]["sandboxID"] != "b" {
		t.Errorf("--json: code %d out %q err %v", code, out, err)
	}
}

func TestSandboxListEmptyJSON(t *testing.T) {
	d := newFakeDaemon(t)
	d.pages = []listPage{{Body: `[]`}}
	code, out, _ := d.run(context.Background(), "", "sandbox", "list", "--json")
	if code != 0 || out != "[]\n" {
		t.Errorf("code %d out %q", code, out)
	}
}

func TestSandboxListRepeatedToken(t *testing.T) {
	d := newFakeDaemon(t)
	d.pages = []listPage{{Body: `[]`, Next: "t0"}}
	code, _, errOut := d.run(context.Background(), "", "sandbox", "list")
	if code != 1 || !strings.Contains(errOut, "repeated page token") {
		t.Errorf("code %d stderr %q", code, errOut)
	}
}

func TestSandboxKill(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "sandbox", "kill", "a", "missing", "b")
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if out != "a\nb\n" {
		t.Errorf("stdout %q", out)
	}
	if errOut != "cellfork: sandbox missing not found (request req-DELETE)\n" {
		t.Errorf("stderr %q", errOut)
	}

	code, out, _ = d.run(context.Background(), "", "sandbox", "kill", "--json", "a", "missing")
	var res []struct {
		SandboxID string `json:"sandboxID"`
		Killed    bool   `json:"killed"`
		Error     string `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 1 || len(res) != 2 ||
		!res[0].Killed || res[1].Killed || res[1].Error == "" {
		t.Errorf("--json: code %d out %q err %v", code, out, err)
	}
}

// sameJSON reports whether two JSON documents hold the same value (key
// order aside).
func sameJSON(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}
