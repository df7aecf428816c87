package envd

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cellfork/cellfork/internal/agent"
	"github.com/cellfork/cellfork/internal/envd/process"
)

var fuzzAccount = agent.Account{Name: "user", UID: 1000, GID: 1000, Home: "/home/user"}

func FuzzResolvePath(f *testing.F) {
	for _, s := range []string{"", "/", "a", "~", "~/x", "~root", "../../etc/passwd", "/a/../../b", "a\x00b", "//x//y/", "./.", strings.Repeat("a/", 3000)} {
		f.Add(s, "")
		f.Add(s, "/work")
	}
	f.Add("", "\x00")
	f.Fuzz(func(t *testing.T, p, workdir string) {
		got, err := resolvePath(p, fuzzAccount, workdir)
		if err != nil {
			if classify(err) != kindInvalid {
				t.Fatalf("error %v is not invalid_argument", err)
			}
			return
		}
		if !filepath.IsAbs(got) || filepath.Clean(got) != got || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("resolvePath(%q) = %q: not absolute and clean", p, got)
		}
		if filepath.IsAbs(p) && got != filepath.Clean(p) {
			t.Fatalf("absolute %q became %q", p, got)
		}
		if p != "" && !filepath.IsAbs(p) && p[0] != '~' && got != filepath.Join(fuzzAccount.Home, p) {
			t.Fatalf("relative %q became %q, not relative to the home directory", p, got)
		}
	})
}

func multipartSeed(parts ...[2]string) []byte {
	var b bytes.Buffer
	for _, p := range parts {
		b.WriteString("--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"" + p[0] + "\"\r\n\r\n" + p[1] + "\r\n")
	}
	b.WriteString("--B--\r\n")
	return b.Bytes()
}

func FuzzReadUploads(f *testing.F) {
	mp := "multipart/form-data; boundary=B"
	f.Add(mp, multipartSeed([2]string{"/home/user/a.txt", "hello"}), "", false)
	f.Add(mp, multipartSeed([2]string{"a", "1"}, [2]string{"b/c", "2"}), "", false)
	f.Add(mp, multipartSeed([2]string{"x", "1"}, [2]string{"y", "2"}), "/one", true)
	f.Add(mp, multipartSeed([2]string{"qu%22ote", "1"}, [2]string{"", "2"}), "", false)
	f.Add(mp, []byte("--B\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nv\r\n--B--"), "", false)
	f.Add("multipart/form-data", []byte("garbage"), "", false)
	f.Add("application/octet-stream", []byte("raw"), "/p", true)
	f.Add("application/octet-stream", []byte("raw"), "", false)
	f.Add("text/plain; charset=\"", []byte{}, "", false)
	f.Fuzz(func(t *testing.T, contentType string, body []byte, pathQuery string, hasPath bool) {
		resolve := func(p string) (string, error) { return resolvePath(p, fuzzAccount, "") }
		var paths []string
		store := func(path string, content io.Reader) error {
			if !filepath.IsAbs(path) {
				t.Fatalf("store got relative path %q", path)
			}
			paths = append(paths, path)
			_, err := io.Copy(io.Discard, &bodyReader{content})
			return err
		}
		err := readUploads(contentType, bytes.NewReader(body), pathQuery, hasPath, resolve, store)
		if err != nil {
			if k := classify(err); k != kindInvalid {
				t.Fatalf("error %v has class %d, want invalid", err, k)
			}
			return
		}
		if len(paths) == 0 {
			t.Fatal("success without a stored file")
		}
		seen := map[string]bool{}
		for _, p := range paths {
			if seen[p] {
				t.Fatalf("path %s stored twice", p)
			}
			seen[p] = true
		}
	})
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(b)
	_ = zw.Close()
	return buf.Bytes()
}

func FuzzInflate(f *testing.F) {
	f.Add(gzipped([]byte("hello")), int64(100))
	f.Add(gzipped(make([]byte, 5000)), int64(100))
	f.Add(gzipped(nil), int64(0))
	f.Add([]byte("not gzip"), int64(10))
	f.Add(gzipped([]byte("x"))[:10], int64(10))
	f.Fuzz(func(t *testing.T, body []byte, limit int64) {
		if limit < 0 || limit > 1<<20 {
			return
		}
		rc, err := inflate(io.NopCloser(bytes.NewReader(body)), "gzip", limit)
		if err != nil {
			if classify(err) != kindInvalid {
				t.Fatalf("header error %v is not invalid", err)
			}
			return
		}
		defer rc.Close()
		n, err := io.Copy(io.Discard, &bodyReader{rc})
		if n > limit {
			t.Fatalf("read %d bytes past the limit %d", n, limit)
		}
		if err != nil {
			if k := classify(err); k != kindInvalid && k != kindTooLarge {
				t.Fatalf("read error %v has class %d", err, k)
			}
		}
	})
}

func FuzzBuildEnv(f *testing.F) {
	f.Add("A", "1", "B", "2")
	f.Add("PATH", "/x", "HOME", "/y")
	f.Add("A=B", "1", "", "")
	f.Add("A", "x\x00y", "K\x00", "v")
	f.Fuzz(func(t *testing.T, gk, gv, rk, rv string) {
		env, err := buildEnv(fuzzAccount, map[string]string{gk: gv}, map[string]string{rk: rv})
		if err != nil {
			if classify(err) != kindInvalid {
				t.Fatalf("error %v is not invalid", err)
			}
			return
		}
		keys := map[string]bool{}
		for _, kv := range env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || !agent.ValidEnvName(k) || strings.IndexByte(v, 0) >= 0 || keys[k] {
				t.Fatalf("bad or duplicate entry %q in %q", kv, env)
			}
			keys[k] = true
		}
		if envValue(env, rk) != rv {
			t.Fatalf("request variable %q=%q lost: %q", rk, rv, env)
		}
		for _, k := range []string{"PATH", "HOME", "USER", "LOGNAME"} {
			if !keys[k] {
				t.Fatalf("%s missing from %q", k, env)
			}
		}
	})
}

func FuzzUsernameFromHeader(f *testing.F) {
	for _, s := range []string{"", "Basic cm9vdDo=", "Basic !!!", "Bearer x", "basic dXNlcjo=", "Basic " + strings.Repeat("A", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		name, err := usernameFromHeader(http.Header{"Authorization": {v}})
		var c *classed
		if err != nil && (!errors.As(err, &c) || c.kind != kindUnauthenticated) {
			t.Fatalf("error %v is not unauthenticated", err)
		}
		if v == "" && (err != nil || name != "") {
			t.Fatalf("empty header gave %q, %v", name, err)
		}
	})
}

// FuzzPrimer: what a zygote runs exports every request variable and every
// changed base variable exactly (quotes, spaces, newlines, $ and
// backslashes included), unsets a base variable the request's base lacks,
// and runs the command in the request's directory.
func FuzzPrimer(f *testing.F) {
	for _, s := range []string{"", "plain", "it's", `"$HOME" \n`, "a\nb", "'; rm -rf / #", "$(id)", "`id`", "\\'\\"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v) {
			return
		}
		spec := procSpec{dir: "/", base: []string{"W=" + v}, req: &process.StartRequest{Process: &process.ProcessConfig{
			Cmd: "/bin/bash", Envs: map[string]string{"V": v}}}}
		had := []string{"GONE=1", "W=" + v + "x"}
		unset, export := envDiff(had, spec.base)
		script := primer(unset, export, spec, `printf '%s|%s|%s|%s' "$PWD" "$V" "$W" "${GONE-unset}"`)
		cmd := exec.Command("/bin/bash", "-c", "exec 3</dev/null; "+script)
		cmd.Env = had
		out, err := cmd.Output()
		if want := "/|" + v + "|" + v + "|unset"; err != nil || string(out) != want {
			t.Fatalf("primer made %q of %q, want %q (%v)", out, v, want, err)
		}
	})
}

// FuzzExecs: a command execs() lets a zygote exec is one command bash
// parses, so prefixing it with exec changes nothing but the process.
func FuzzExecs(f *testing.F) {
	for _, s := range []string{"sleep 1", "ls 'a b' \"c\"", "a;b", "x=1 y", "a 'b", "echo $X", "f() { :; }"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cmd string) {
		if !execs(cmd) || strings.IndexByte(cmd, 0) >= 0 {
			return
		}
		if out, err := exec.Command("/bin/bash", "-n", "-c", "exec "+cmd).CombinedOutput(); err != nil {
			t.Fatalf("execs(%q) but bash cannot parse it after exec: %s", cmd, out)
		}
	})
}
