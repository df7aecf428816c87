package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrmutate "github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cellfork/cellfork/internal/envd/process"
	"github.com/cellfork/cellfork/internal/envd/process/processconnect"
)

// registryBin is the CNCF distribution registry scripts/setup.sh builds.
const registryBin = "/usr/local/lib/cellfork/bin/registry"

// testRegistry is a real registry server on a local port.
type testRegistry struct {
	host string // 127.0.0.1:port
	cmd  *exec.Cmd
}

func startRegistry(t *testing.T) *testRegistry {
	t.Helper()
	if _, err := os.Stat(registryBin); err != nil {
		t.Fatalf("%s missing: run `make setup`", registryBin)
	}
	dir := t.TempDir()
	host := freeAddr()
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), host)
	os.WriteFile(filepath.Join(dir, "config.yml"), []byte(cfg), 0o644)
	cmd := exec.Command(registryBin, "serve", filepath.Join(dir, "config.yml"))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &testRegistry{host: host, cmd: cmd}
	t.Cleanup(r.stop)
	eventually(t, 10*time.Second, "the registry to listen", func() bool {
		c, err := net.Dial("tcp", host)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return r
}

func (r *testRegistry) stop() {
	if r.cmd.Process != nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
	}
}

// busyboxImage is a small image: static busybox with its applets, a user
// database with root only, and files.
func busyboxImage(t *testing.T, files map[string]string) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("/bin/busybox missing (busybox-static; run `make setup`): %v", err)
	}
	applets, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(p string, mode int64) {
		tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeDir, Mode: mode})
	}
	file := func(p, body string, mode int64) {
		tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(body))})
		io.WriteString(tw, body)
	}
	for _, d := range []string{"bin", "etc", "root", "home", "usr", "usr/bin", "var", "www"} {
		dir(d, 0o755)
	}
	dir("tmp", 0o1777)
	file("bin/busybox", string(bb), 0o755)
	for _, a := range strings.Fields(string(applets)) {
		if a != "busybox" {
			tw.WriteHeader(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777})
		}
	}
	file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644)
	file("etc/group", "root:x:0:\n", 0o644)
	for p, body := range files {
		file(p, body, 0o644)
	}
	tw.Close()
	b := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := ggcrmutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = ggcrmutate.Config(img, v1.Config{Env: []string{"PATH=/bin:/usr/bin", "FROM_IMAGE=yes"}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func (r *testRegistry) push(t *testing.T, repo string, img v1.Image) string {
	t.Helper()
	ref := r.host + "/" + repo
	tag, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref
}

// contextTar is a gzipped tar of files, as the SDKs upload a COPY's
// sources; and its hash.
func contextTar(files map[string]string) ([]byte, string) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for p, body := range files {
		tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		io.WriteString(tw, body)
	}
	tw.Close()
	gz.Close()
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(sum[:])
}

// newBuild makes a template build waiting for its steps.
func newBuild(t *testing.T, name string) (templateID, buildID string) {
	t.Helper()
	r := call(t, "POST", "/v3/templates", map[string]any{"name": name, "cpuCount": 1, "memoryMB": 512})
	if r.status != http.StatusAccepted {
		t.Fatalf("create template: %d %s", r.status, r.body)
	}
	var out struct{ TemplateID, BuildID string }
	r.json(t, &out)
	t.Cleanup(func() { call(t, "DELETE", "/templates/"+out.TemplateID, nil) })
	return out.TemplateID, out.BuildID
}

// upload sends files through the upload link, as the SDKs do (no API key).
func upload(t *testing.T, templateID string, data []byte, hash string) {
	t.Helper()
	r := call(t, "GET", "/templates/"+templateID+"/files/"+hash, nil)
	var link struct {
		Present bool
		URL     string
	}
	r.json(t, &link)
	if link.Present {
		return
	}
	u, _ := url.Parse(link.URL)
	req, _ := http.NewRequest("PUT", d.url+u.RequestURI(), bytes.NewReader(data))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("upload: %v %v", resp, err)
	}
	resp.Body.Close()
}

type buildStatus struct {
	Status     string
	LogEntries []struct{ Message, Level, Step string }
	Reason     *struct {
		Message string
		Step    string
	}
}

// startBuild starts a build and waits for its end.
func startBuild(t *testing.T, templateID, buildID string, spec map[string]any) buildStatus {
	t.Helper()
	r := call(t, "POST", "/v2/templates/"+templateID+"/builds/"+buildID, spec)
	if r.status != http.StatusAccepted {
		t.Fatalf("start build: %d %s", r.status, r.body)
	}
	var all buildStatus
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var st buildStatus
		call(t, "GET", fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", templateID, buildID, len(all.LogEntries)), nil).json(t, &st)
		all.LogEntries = append(all.LogEntries, st.LogEntries...)
		all.Status, all.Reason = st.Status, st.Reason
		if st.Status != "building" && len(st.LogEntries) == 0 {
			return all
		}
		if time.Now().After(deadline) {
			t.Fatalf("build did not finish: %+v", all)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (b buildStatus) log() string {
	var s strings.Builder
	for _, e := range b.LogEntries {
		fmt.Fprintf(&s, "[%s %s] %s\n", e.Step, e.Level, e.Message)
	}
	return s.String()
}

// shBusybox runs a command in the sandbox with /bin/sh (busybox images have no
// bash).
func shBusybox(t *testing.T, sb sandboxInfo, cmd string) (string, int) {
	t.Helper()
	client := processconnect.NewProcessClient(&http.Client{Transport: headerTransport{envdHeaders(sb)}}, d.url, connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := client.Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", cmd}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	code := -1
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if data := ev.GetData(); data != nil {
			out.Write(data.GetStdout())
			out.Write(data.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			code = int(end.GetExitCode())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return out.String(), code
}

// TestTemplateFromRegistryImage builds a template from an image in a local
// registry with every kind of step and a start command serving HTTP, and
// checks that a sandbox created from it answers on that port at once, as
// the template's user, in its working directory, with its environment.
func TestTemplateFromRegistryImage(t *testing.T) {
	reg := startRegistry(t)
	ref := reg.push(t, "test/busybox:1", busyboxImage(t, map[string]string{"www/index.html": "from the image\n"}))
	tid, bid := newBuild(t, "tpl-registry")
	ctxData, hash := contextTar(map[string]string{"site/index.html": "hello from the template\n", "site/extra.txt": "x"})
	upload(t, tid, ctxData, hash)
	st := startBuild(t, tid, bid, map[string]any{
		"fromImage": ref,
		"steps": []map[string]any{
			{"type": "COPY", "args": []string{"site/*", "/www/", "", ""}, "filesHash": hash},
			{"type": "ENV", "args": []string{"GREETING", "hi $FROM_IMAGE"}},
			{"type": "RUN", "args": []string{"echo \"$GREETING\" > /greeting && id -un > /built-as"}},
			{"type": "USER", "args": []string{"app"}},
			{"type": "WORKDIR", "args": []string{"/srv/app"}},
			{"type": "RUN", "args": []string{"id -un > whoami.txt && pwd > pwd.txt"}},
			{"type": "RUN", "args": []string{"ln -s /greeting /srv/app/link", "root"}},
		},
		"startCmd": "httpd -f -p 8080 -h /www",
		"readyCmd": "wget -q -O /dev/null http://127.0.0.1:8080/",
	})
	if st.Status != "ready" {
		t.Fatalf("build %s: %+v\n%s", st.Status, st.Reason, st.log())
	}
	for _, want := range []string{"provisioning the image", "[builder 7/7]", "Template is ready", "Snapshot of the running template"} {
		if !strings.Contains(st.log(), want) {
			t.Errorf("build log lacks %q:\n%s", want, st.log())
		}
	}
	sb := create(t, map[string]any{"templateID": "tpl-registry"})
	// The start command runs already: the first request reaches it.
	r := dataCall(t, "GET", "/index.html", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "8080"}, nil)
	if r.status != 200 || string(r.body) != "hello from the template\n" {
		t.Fatalf("GET :8080 right after create: %d %q", r.status, r.body)
	}
	out, code := shBusybox(t, sb, `cat /greeting /built-as /srv/app/whoami.txt /srv/app/pwd.txt; id -un; pwd; readlink /srv/app/link; echo "$GREETING"`)
	want := "hi yes\nroot\napp\n/srv/app\napp\n/srv/app\n/greeting\nhi yes\n"
	if code != 0 || out != want {
		t.Errorf("in the sandbox: exit %d\n%q\nwant\n%q", code, out, want)
	}
}

// TestTemplateRebuildRunsOnlyTheChangedStep: a rebuild that changes the
// last of ten steps runs only that one and says so.
func TestTemplateRebuildRunsOnlyTheChangedStep(t *testing.T) {
	reg := startRegistry(t)
	ref := reg.push(t, "test/busybox:1", busyboxImage(t, nil))
	steps := func(last string) []map[string]any {
		var s []map[string]any
		for i := 1; i <= 9; i++ {
			s = append(s, map[string]any{"type": "RUN", "args": []string{fmt.Sprintf("echo %d >> /steps", i)}})
		}
		return append(s, map[string]any{"type": "RUN", "args": []string{last}})
	}
	tid, bid := newBuild(t, "tpl-cache")
	first := startBuild(t, tid, bid, map[string]any{"fromImage": ref, "steps": steps("echo first > /last")})
	if first.Status != "ready" {
		t.Fatalf("first build: %+v\n%s", first.Reason, first.log())
	}
	_, bid2 := newBuild(t, "tpl-cache")
	second := startBuild(t, tid, bid2, map[string]any{"fromImage": ref, "steps": steps("echo second > /last")})
	if second.Status != "ready" {
		t.Fatalf("second build: %+v\n%s", second.Reason, second.log())
	}
	log := second.log()
	if n := strings.Count(log, "CACHED [builder"); n != 9 || !strings.Contains(log, "9 of 10 steps came from the cache") ||
		strings.Contains(log, "CACHED [builder 10/10]") {
		t.Errorf("rebuild ran other steps than the last (%d cached):\n%s", n, log)
	}
	sb := create(t, map[string]any{"templateID": "tpl-cache"})
	if out, _ := shBusybox(t, sb, "cat /steps /last"); out != "1\n2\n3\n4\n5\n6\n7\n8\n9\nsecond\n" {
		t.Errorf("rebuilt template: %q", out)
	}
	// force skips the cache.
	_, bid3 := newBuild(t, "tpl-cache")
	third := startBuild(t, tid, bid3, map[string]any{"fromImage": ref, "force": true, "steps": steps("echo second > /last")})
	if third.Status != "ready" || strings.Contains(third.log(), "CACHED") {
		t.Errorf("forced build used the cache:\n%s", third.log())
	}
}

// TestTemplateFromDockerfileAndArchive: a Dockerfile (its COPY from an
// uploaded context) and an image archive (`cellfork template import`).
func TestTemplateFromDockerfileAndArchive(t *testing.T) {
	reg := startRegistry(t)
	ref := reg.push(t, "test/busybox:2", busyboxImage(t, nil))
	tid, bid := newBuild(t, "tpl-dockerfile")
	ctxData, hash := contextTar(map[string]string{"app/main.sh": "echo main", "app/data.txt": "data", "other.txt": "o"})
	upload(t, tid, ctxData, hash)
	st := startBuild(t, tid, bid, map[string]any{
		"dockerfile": "ARG BASE\nFROM ${BASE}\nARG MSG=default\nENV WHO=docker\nWORKDIR /srv\n" +
			"COPY app/*.txt ./\nRUN echo \"$MSG $WHO\" > built.txt\nUSER root\nCMD [\"httpd\", \"-f\", \"-p\", \"8081\", \"-h\", \"/srv\"]\n" +
			"HEALTHCHECK CMD wget -q -O /dev/null http://127.0.0.1:8081/built.txt\n",
		"dockerfileContext": hash,
		"buildArgs":         map[string]string{"BASE": ref, "MSG": "arg"},
	})
	if st.Status != "ready" {
		t.Fatalf("dockerfile build: %+v\n%s", st.Reason, st.log())
	}
	sb := create(t, map[string]any{"templateID": "tpl-dockerfile"})
	r := dataCall(t, "GET", "/built.txt", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "8081"}, nil)
	if r.status != 200 || string(r.body) != "arg docker\n" {
		t.Errorf("CMD server: %d %q", r.status, r.body)
	}
	if out, _ := shBusybox(t, sb, "ls /srv"); out != "built.txt\ndata.txt\n" {
		t.Errorf("COPY app/*.txt ./ gave %q", out)
	}

	// An image archive, uploaded like any file.
	var arch bytes.Buffer
	tag, _ := name.NewTag("example/archived:1")
	if err := tarball.Write(tag, busyboxImage(t, map[string]string{"etc/archived": "yes"}), &arch); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(arch.Bytes())
	ahash := hex.EncodeToString(sum[:])
	tid2, bid2 := newBuild(t, "tpl-archive")
	upload(t, tid2, arch.Bytes(), ahash)
	st = startBuild(t, tid2, bid2, map[string]any{"fromImageFile": ahash})
	if st.Status != "ready" {
		t.Fatalf("archive build: %+v\n%s", st.Reason, st.log())
	}
	sb2 := create(t, map[string]any{"templateID": "tpl-archive"})
	if out, _ := shBusybox(t, sb2, "cat /etc/archived"); out != "yes" {
		t.Errorf("archive content: %q", out)
	}
}

// TestTemplateBuildErrors: a failing step, missing files, an unknown image,
// a registry that is down, a bad Dockerfile, a runaway step: each is a
// clear error naming its step, and nothing is left behind.
func TestTemplateBuildErrors(t *testing.T) {
	reg := startRegistry(t)
	ref := reg.push(t, "test/busybox:1", busyboxImage(t, nil))
	missing := strings.Repeat("0", 64)
	for _, c := range []struct {
		name, step, msg string
		spec            map[string]any
	}{
		{"failing step", "2", "failed to run command 'exit 3': exit status 3", map[string]any{"fromImage": ref,
			"steps": []map[string]any{{"type": "RUN", "args": []string{"true"}}, {"type": "RUN", "args": []string{"exit 3"}}}}},
		{"unknown user", "1", "command failed: unauthenticated: invalid username: 'nobody123'", map[string]any{"fromImage": ref,
			"steps": []map[string]any{{"type": "RUN", "args": []string{"whoami", "nobody123"}}}}},
		{"missing files", "1", "were not uploaded", map[string]any{"fromImage": ref,
			"steps": []map[string]any{{"type": "COPY", "args": []string{"a", "/a"}, "filesHash": missing}}}},
		{"unknown image", "base", "not found in registry", map[string]any{"fromImage": reg.host + "/test/nope:1"}},
		{"start command fails", "finalize", "start command failed", map[string]any{"fromImage": ref,
			"startCmd": "exit 7", "readyCmd": "sleep 1; false"}},
		{"runaway step", "1", "longer than the build step limit", map[string]any{"fromImage": ref,
			"steps": []map[string]any{{"type": "RUN", "args": []string{"sleep 600"}}}}},
		{"disk hog", "1", "more than the build disk limit", map[string]any{"fromImage": ref,
			"steps": []map[string]any{{"type": "RUN", "args": []string{"dd if=/dev/zero of=/big bs=1M count=400"}}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tid, bid := newBuild(t, "tpl-err")
			st := startBuild(t, tid, bid, c.spec)
			if st.Status != "error" || st.Reason == nil || st.Reason.Step != c.step || !strings.Contains(st.Reason.Message, c.msg) {
				t.Fatalf("got %s %+v, want error at step %s with %q\n%s", st.Status, st.Reason, c.step, c.msg, st.log())
			}
		})
	}
	// A registry that is down.
	reg.stop()
	tid, bid := newBuild(t, "tpl-err")
	st := startBuild(t, tid, bid, map[string]any{"fromImage": ref})
	if st.Status != "error" || st.Reason.Step != "base" || !strings.Contains(st.Reason.Message, "unreachable") {
		t.Errorf("registry down: %s %+v", st.Status, st.Reason)
	}
	// Refused before the build starts.
	tid, bid = newBuild(t, "tpl-err")
	for _, bad := range []map[string]any{
		{"dockerfile": "RUN echo no FROM"},
		{"dockerfile": "FROM a\nCOPY ../x /x", "dockerfileContext": missing},
		{"fromImage": ref, "steps": []map[string]any{{"type": "BOGUS", "args": []string{"x"}}}},
	} {
		if r := call(t, "POST", "/v2/templates/"+tid+"/builds/"+bid, bad); r.status != 400 || r.errMessage() == "" {
			t.Errorf("%v: %d %s", bad, r.status, r.body)
		}
	}
	// Nothing left: no half layers, no mounts, no build sandboxes.
	layersDir := filepath.Join(d.dataDir, "custom-templates", "layers")
	eventually(t, 30*time.Second, "build sandboxes and mounts to go", func() bool {
		ents, _ := os.ReadDir(layersDir)
		for _, e := range ents {
			if strings.Contains(e.Name(), ".tmp-") {
				return false
			}
		}
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		return !strings.Contains(string(mounts), layersDir)
	})
}
