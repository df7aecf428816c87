package envd

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cellfork/cellfork/internal/agent"
)

// apiError is the error body of the plain HTTP endpoints.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *env) do(method, path string, q url.Values, body io.Reader, hdr http.Header) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path+"?"+q.Encode(), body)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return res, b
}

// multipartBody builds a body like httpx does for the SDK: one "file" part
// per file, filename = the target path.
func multipartBody(t *testing.T, files map[string]string, order []string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, name := range order {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename="%s"`, strings.ReplaceAll(name, `"`, "%22")))
		h.Set("Content-Type", "text/plain")
		pw, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = pw.Write([]byte(files[name]))
	}
	_ = mw.Close()
	return mw.FormDataContentType(), &buf
}

func decodeWritten(t *testing.T, b []byte) []writtenFile {
	t.Helper()
	var out []writtenFile
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return out
}

func wantAPIError(t *testing.T, res *http.Response, body []byte, status int) {
	t.Helper()
	var ae apiError
	if res.StatusCode != status || json.Unmarshal(body, &ae) != nil || ae.Code != status || ae.Message == "" {
		t.Fatalf("got %d %q, want %d with a JSON error body", res.StatusCode, body, status)
	}
}

func TestUploadMultipartSingleAndDownload(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(e.dir, "new", "a.txt")
	ct, body := multipartBody(t, map[string]string{path: "hello"}, []string{path})
	res, b := e.do("POST", "/files", url.Values{"path": {path}, "username": {"nobody"}}, body, http.Header{"Content-Type": {ct}})
	if res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	got := decodeWritten(t, b)
	if len(got) != 1 || got[0].Name != "a.txt" || got[0].Type != "file" || got[0].Path != path || got[0].Metadata != nil {
		t.Fatalf("response %s", b)
	}
	for _, p := range []string{path, filepath.Dir(path)} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65534 || st.Gid != 65534 {
			t.Fatalf("%s owned by %d:%d, want nobody", p, st.Uid, st.Gid)
		}
	}

	// Overwrite, then download.
	ct, body = multipartBody(t, map[string]string{path: "second"}, []string{path})
	if res, b := e.do("POST", "/files", url.Values{"path": {path}}, body, http.Header{"Content-Type": {ct}}); res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	res, b = e.do("GET", "/files", url.Values{"path": {path}}, nil, nil)
	if res.StatusCode != 200 || string(b) != "second" {
		t.Fatalf("download: %d %q", res.StatusCode, b)
	}
	if cd := res.Header.Get("Content-Disposition"); !strings.Contains(cd, "a.txt") {
		t.Fatalf("Content-Disposition %q", cd)
	}
}

func TestUploadMultipartSeveralFiles(t *testing.T) {
	e := newEnv(t)
	p1 := filepath.Join(e.dir, "one.txt")
	p2 := filepath.Join(e.dir, "deep", `quo"te.txt`)
	ct, body := multipartBody(t, map[string]string{p1: "1", p2: "2"}, []string{p1, p2})
	res, b := e.do("POST", "/files", nil, body, http.Header{"Content-Type": {ct}})
	if res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	got := decodeWritten(t, b)
	if len(got) != 2 || got[0].Path != p1 || got[1].Path != p2 || got[1].Name != `quo"te.txt` {
		t.Fatalf("response %s", b)
	}
	for p, want := range map[string]string{p1: "1", p2: "2"} {
		if c, err := os.ReadFile(p); err != nil || string(c) != want {
			t.Fatalf("%s = %q (%v)", p, c, err)
		}
	}

	// The same path twice in one request is refused.
	ct, body = multipartBody(t, map[string]string{p1: "1"}, []string{p1, p1})
	res, b = e.do("POST", "/files", nil, body, http.Header{"Content-Type": {ct}})
	wantAPIError(t, res, b, 400)
	// No file part at all.
	ct, body = multipartBody(t, nil, nil)
	res, b = e.do("POST", "/files", nil, body, http.Header{"Content-Type": {ct}})
	wantAPIError(t, res, b, 400)
}

func TestUploadOctetStreamGzipAndMetadata(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(e.dir, "raw.bin")
	payload := bytes.Repeat([]byte("0123456789"), 100000)
	res, b := e.do("POST", "/files", url.Values{"path": {path}}, bytes.NewReader(payload), http.Header{
		"Content-Type":     {"application/octet-stream"},
		"X-Metadata-Owner": {"Alice"},
		"X-Metadata-Tag":   {"t1"},
	})
	if res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	if c, _ := os.ReadFile(path); !bytes.Equal(c, payload) {
		t.Fatal("raw upload content differs")
	}
	got := decodeWritten(t, b)
	if got[0].Metadata["owner"] != "Alice" || got[0].Metadata["tag"] != "t1" {
		t.Fatalf("response %s", b)
	}
	if md := readMetadata(path); md != nil && (md["owner"] != "Alice" || md["tag"] != "t1") {
		t.Fatalf("xattrs = %v", md)
	}

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("compressed content"))
	_ = zw.Close()
	res, b = e.do("POST", "/files", url.Values{"path": {path}}, &gz, http.Header{
		"Content-Type": {"application/octet-stream"}, "Content-Encoding": {"gzip"},
	})
	if res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	if c, _ := os.ReadFile(path); string(c) != "compressed content" {
		t.Fatalf("gzip upload wrote %q", c)
	}

	res, b = e.do("POST", "/files", url.Values{"path": {path}}, strings.NewReader("not gzip"), http.Header{
		"Content-Type": {"application/octet-stream"}, "Content-Encoding": {"gzip"},
	})
	wantAPIError(t, res, b, 400)
	res, b = e.do("POST", "/files", nil, strings.NewReader("x"), http.Header{"Content-Type": {"application/octet-stream"}})
	wantAPIError(t, res, b, 400)
	res, b = e.do("POST", "/files", url.Values{"path": {path}}, strings.NewReader("x"), http.Header{"Content-Type": {"text/plain"}})
	wantAPIError(t, res, b, 400)
}

func TestUploadErrors(t *testing.T) {
	e := newEnv(t)
	raw := http.Header{"Content-Type": {"application/octet-stream"}}
	res, b := e.do("POST", "/files", url.Values{"path": {filepath.Join(e.dir, "x")}, "username": {"no-such-user-xyz"}}, strings.NewReader("x"), raw)
	wantAPIError(t, res, b, 401)
	res, b = e.do("POST", "/files", url.Values{"path": {e.dir}}, strings.NewReader("x"), raw)
	wantAPIError(t, res, b, 400)
	res, b = e.do("POST", "/files", url.Values{"path": {"/tmp/a\x00b"}}, strings.NewReader("x"), raw)
	wantAPIError(t, res, b, 400)
	mustWrite(t, filepath.Join(e.dir, "file"), "")
	res, b = e.do("POST", "/files", url.Values{"path": {filepath.Join(e.dir, "file", "below")}}, strings.NewReader("x"), raw)
	wantAPIError(t, res, b, 400)
}

// TestUploadRelativePath: relative paths (and ~/) are the user's home's,
// for uploads (octet-stream and multipart) and downloads.
func TestUploadRelativePath(t *testing.T) {
	e := newEnv(t)
	rel := fmt.Sprintf(".cellfork-envd-test-%d/f.txt", os.Getpid())
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Join("/root", filepath.Dir(rel))) })
	res, b := e.do("POST", "/files", url.Values{"path": {rel}}, strings.NewReader("rel"), http.Header{"Content-Type": {"application/octet-stream"}})
	if res.StatusCode != 200 || decodeWritten(t, b)[0].Path != filepath.Join("/root", rel) {
		t.Fatalf("relative upload: %d %s", res.StatusCode, b)
	}
	res, b = e.do("GET", "/files", url.Values{"path": {"~/" + rel}}, nil, nil)
	if res.StatusCode != 200 || string(b) != "rel" {
		t.Fatalf("%d %q", res.StatusCode, b)
	}
	other := filepath.Join(filepath.Dir(rel), "g.txt")
	ct, body := multipartBody(t, map[string]string{other: "multi"}, []string{other})
	res, b = e.do("POST", "/files", nil, body, http.Header{"Content-Type": {ct}})
	if res.StatusCode != 200 || decodeWritten(t, b)[0].Path != filepath.Join("/root", other) {
		t.Fatalf("relative multipart upload: %d %s", res.StatusCode, b)
	}
	res, b = e.do("GET", "/files", url.Values{"path": {other}}, nil, nil)
	if res.StatusCode != 200 || string(b) != "multi" {
		t.Fatalf("%d %q", res.StatusCode, b)
	}
}

// TestUploadReplacesMetadata: an upload's metadata is the file's whole
// metadata; one without any clears the old, as upstream.
func TestUploadReplacesMetadata(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(e.dir, "m.txt")
	raw := func(md map[string]string) []writtenFile {
		h := http.Header{"Content-Type": {"application/octet-stream"}}
		for k, v := range md {
			h.Set("X-Metadata-"+k, v)
		}
		res, b := e.do("POST", "/files", url.Values{"path": {path}}, strings.NewReader("x"), h)
		if res.StatusCode != 200 {
			t.Fatalf("%d %s", res.StatusCode, b)
		}
		return decodeWritten(t, b)
	}
	got := raw(map[string]string{"Author": "mish", "Stage": "raw"})
	if readMetadata(path) == nil {
		t.Skip("no user xattrs here")
	}
	if !maps.Equal(got[0].Metadata, map[string]string{"author": "mish", "stage": "raw"}) {
		t.Fatalf("response metadata = %v", got[0].Metadata)
	}
	got = raw(map[string]string{"Stage": "clean"})
	if md := readMetadata(path); !maps.Equal(md, map[string]string{"stage": "clean"}) || !maps.Equal(got[0].Metadata, md) {
		t.Fatalf("after a second upload: %v (response %v)", md, got[0].Metadata)
	}
	// Metadata set by other means is the file's too, and goes as well.
	if err := syscall.Setxattr(path, "user.e2b.extra", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setxattr(path, "user.other", []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	got = raw(nil)
	if md := readMetadata(path); md != nil || got[0].Metadata != nil {
		t.Fatalf("after an upload without metadata: %v (response %v)", md, got[0].Metadata)
	}
	if v, ok := getXattr(path, "user.other"); !ok || v != "kept" {
		t.Fatal("an xattr outside user.e2b. was removed")
	}
	// Metadata that could not be stored is refused before anything is written.
	for _, h := range []http.Header{
		{"X-Metadata-K": {"caf\xc3\xa9"}},
		{"X-Metadata-" + strings.Repeat("k", 250): {"v"}},
		{"X-Metadata-A": {strings.Repeat("v", 4100)}},
	} {
		h.Set("Content-Type", "application/octet-stream")
		res, b := e.do("POST", "/files", url.Values{"path": {filepath.Join(e.dir, "refused")}}, strings.NewReader("x"), h)
		wantAPIError(t, res, b, 400)
		if _, err := os.Stat(filepath.Join(e.dir, "refused")); !os.IsNotExist(err) {
			t.Fatal("a refused upload created its file")
		}
	}
}

// TestDownloadProcFiles: procfs and sysfs files report size 0 and may not
// seek; they are streamed.
func TestDownloadProcFiles(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"/proc/sys/kernel/random/boot_id", "/proc/self/status", "/sys/kernel/mm/transparent_hugepage/enabled"} {
		want, err := os.ReadFile(p)
		if err != nil {
			continue // not on this kernel
		}
		res, b := e.do("GET", "/files", url.Values{"path": {p}}, nil, nil)
		if res.StatusCode != 200 || len(b) == 0 {
			t.Fatalf("%s: %d %q", p, res.StatusCode, b)
		}
		if p != "/proc/self/status" && string(b) != string(want) {
			t.Fatalf("%s: got %q, want %q", p, b, want)
		}
	}
	// An empty regular file is still an empty 200.
	mustWrite(t, filepath.Join(e.dir, "empty"), "")
	res, b := e.do("GET", "/files", url.Values{"path": {filepath.Join(e.dir, "empty")}}, nil, nil)
	if res.StatusCode != 200 || len(b) != 0 {
		t.Fatalf("empty file: %d %q", res.StatusCode, b)
	}
}

// TestUploadLimitFromInit: the daemon sets the limit through /init (a
// restored agent was booted by whatever daemon took the image).
func TestUploadLimitFromInit(t *testing.T) {
	e := newEnv(t)
	res, b := e.do("POST", "/init", nil, strings.NewReader(`{"maxUploadBytes":100}`), http.Header{"Content-Type": {"application/json"}})
	if res.StatusCode != http.StatusNoContent {
		t.Fatalf("init: %d %s", res.StatusCode, b)
	}
	raw := http.Header{"Content-Type": {"application/octet-stream"}}
	path := filepath.Join(e.dir, "limited")
	res, b = e.do("POST", "/files", url.Values{"path": {path}}, bytes.NewReader(make([]byte, 101)), raw)
	wantAPIError(t, res, b, 413)
	res, b = e.do("POST", "/files", url.Values{"path": {path}}, bytes.NewReader(make([]byte, 100)), raw)
	if res.StatusCode != 200 {
		t.Fatalf("upload at the limit: %d %s", res.StatusCode, b)
	}
}

func TestUploadSizeLimit(t *testing.T) {
	t.Setenv("CELLFORK_MAX_UPLOAD_BYTES", "100")
	e := newEnv(t)
	path := filepath.Join(e.dir, "big")
	raw := http.Header{"Content-Type": {"application/octet-stream"}}
	res, b := e.do("POST", "/files", url.Values{"path": {path}}, bytes.NewReader(make([]byte, 101)), raw)
	wantAPIError(t, res, b, 413)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("a partial file was left behind")
	}
	// Small on the wire, too large once inflated.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(make([]byte, 10000))
	_ = zw.Close()
	res, b = e.do("POST", "/files", url.Values{"path": {path}}, &gz, http.Header{"Content-Type": raw["Content-Type"], "Content-Encoding": {"gzip"}})
	wantAPIError(t, res, b, 413)
	res, b = e.do("POST", "/files", url.Values{"path": {path}}, bytes.NewReader(make([]byte, 100)), raw)
	if res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
}

func TestDownloadErrors(t *testing.T) {
	e := newEnv(t)
	res, b := e.do("GET", "/files", url.Values{"path": {filepath.Join(e.dir, "missing")}}, nil, nil)
	wantAPIError(t, res, b, 404)
	res, b = e.do("GET", "/files", url.Values{"path": {e.dir}}, nil, nil)
	wantAPIError(t, res, b, 400)
	res, b = e.do("GET", "/files", url.Values{"path": {"/etc/hostname"}, "username": {"no-such-user-xyz"}}, nil, nil)
	wantAPIError(t, res, b, 401)
}

func TestHealthInitEnvsMetrics(t *testing.T) {
	e := newEnv(t)
	if res, _ := e.do("GET", "/health", nil, nil, nil); res.StatusCode != 204 {
		t.Fatalf("health %d", res.StatusCode)
	}
	body := `{"envVars":{"A":"1"},"defaultUser":"nobody","defaultWorkdir":"/tmp","accessToken":"ignored"}`
	if res, b := e.do("POST", "/init", nil, strings.NewReader(body), nil); res.StatusCode != 204 {
		t.Fatalf("init %d %s", res.StatusCode, b)
	}
	if e.settings.User() != "nobody" || e.settings.Workdir() != "/tmp" {
		t.Fatalf("settings %q %q", e.settings.User(), e.settings.Workdir())
	}
	res, b := e.do("GET", "/envs", nil, nil, nil)
	var envs map[string]string
	if res.StatusCode != 200 || json.Unmarshal(b, &envs) != nil || envs["A"] != "1" || envs["CELLFORK_GLOBAL"] != "g" {
		t.Fatalf("envs %d %s", res.StatusCode, b)
	}
	res, b = e.do("POST", "/init", nil, strings.NewReader(`{"envVars":{"A=B":"1"}}`), nil)
	wantAPIError(t, res, b, 400)
	res, b = e.do("POST", "/init", nil, strings.NewReader(`not json`), nil)
	wantAPIError(t, res, b, 400)
	res, b = e.do("POST", "/init", nil, strings.NewReader(`{"pidsMax":-1}`), nil)
	wantAPIError(t, res, b, 400)
	for _, bad := range []string{``, `null`, `[]`} {
		res, b = e.do("POST", "/init", nil, strings.NewReader(bad), nil)
		wantAPIError(t, res, b, 400)
	}

	res, b = e.do("GET", "/metrics", nil, nil, nil)
	var m map[string]float64
	if res.StatusCode != 200 || json.Unmarshal(b, &m) != nil {
		t.Fatalf("metrics %d %s", res.StatusCode, b)
	}
	for _, k := range []string{"ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "disk_used", "disk_total"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("metrics lack %s: %s", k, b)
		}
	}
	if m["cpu_count"] < 1 || m["mem_total"] <= 0 || m["disk_total"] <= 0 || m["cpu_used_pct"] < 0 || m["cpu_used_pct"] > 100 {
		t.Fatalf("implausible metrics %s", b)
	}
}

// Only the daemon's address may POST /init: code inside the sandbox must
// not reset its environment or raise its process limits.
func TestInitOnlyFromTheDaemon(t *testing.T) {
	s := agent.NewSettings()
	s.Init("root", t.TempDir(), nil)
	h := New(s, netip.MustParseAddr("10.88.0.1"), nil)
	defer h.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()
	res, err := http.Post(srv.URL+"/init", "application/json", strings.NewReader(`{"pidsMax": 100000, "defaultUser": "nobody"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	wantAPIError(t, res, b, 403)
	if s.User() != "root" {
		t.Fatalf("a refused /init changed the default user to %q", s.User())
	}
}
