// Package integration drives the real daemon binary (bin/cellfork, built by
// `make build`) with real gVisor sandboxes over real HTTP. Every
// control-plane response is checked against internal/api/openapi.yaml.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"golang.org/x/sys/unix"

	"github.com/cellfork/cellfork/internal/netns/netnstest"
)

const apiKey = "itest-key"

// daemon is one running `cellfork serve`.
type daemon struct {
	url     string
	dataDir string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the process has exited
	log     *bytes.Buffer
	logMu   *sync.Mutex
}

var (
	repoRoot string
	d        *daemon
	router   routers.Router
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "integration tests need root (network namespaces, gVisor)")
		os.Exit(1)
	}
	wd, _ := os.Getwd()
	repoRoot = filepath.Join(wd, "..", "..")
	if _, err := os.Stat(filepath.Join(repoRoot, "bin", "cellfork")); err != nil {
		fmt.Fprintln(os.Stderr, "bin/cellfork missing: run `make build` (make test does)")
		os.Exit(1)
	}
	if err := loadSpec(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The daemon resolves the sandboxes' names through a test resolver
	// that knows the fake internet's names (netnstest.Names).
	dnsAddr, stopDNS, err := netnstest.ServeDNS()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer stopDNS()
	testFlags = append(testFlags, "--dns", dnsAddr)
	dataDir, _ := os.MkdirTemp("", "cellfork-itest-")
	// The egress proxy verifies hosts with network rules; the fake
	// internet's certificate is signed by the test root.
	rootFile := filepath.Join(dataDir, "..", filepath.Base(dataDir)+"-upstream-ca.pem")
	if err := os.WriteFile(rootFile, netnstest.RootPEM(), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testFlags = append(testFlags, "--upstream-ca", rootFile)
	d, err = startDaemon(dataDir, freeAddr())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := writeSecurityReport(); err != nil {
		fmt.Fprintln(os.Stderr, "writing the security report:", err)
		code = 1
	}
	if code != 0 {
		logs := d.logs()
		if len(logs) > 6000 {
			logs = logs[len(logs)-6000:]
		}
		fmt.Fprintf(os.Stderr, "--- daemon log (tail)\n%s\n", logs)
	}
	d.stop()
	// A daemon that stops destroys its pool; sandboxes the tests killed are
	// gone. Anything left under its runsc root leaked.
	// (runsc's flag is -quiet: -q is refused, and an unchecked failure
	// here would hide every leak.)
	out, err := exec.Command("/usr/local/lib/cellfork/runsc", "--root", filepath.Join(dataDir, "runsc"), "list", "-quiet").Output()
	if err != nil {
		fmt.Fprintf(os.Stderr, "listing runsc containers for the leak check: %v\n", err)
		code = 1
	} else if len(bytes.TrimSpace(out)) > 0 {
		fmt.Fprintf(os.Stderr, "leak: runsc containers left after the daemon stopped: %s\n", bytes.Fields(out))
		for _, id := range bytes.Fields(out) {
			_ = exec.Command("/usr/local/lib/cellfork/runsc", "--root", filepath.Join(dataDir, "runsc"), "delete", "-force", string(id)).Run()
		}
		code = 1
	}
	for unix.Unmount(filepath.Join(dataDir, "runsc", "null-netns"), unix.MNT_DETACH) == nil {
	}
	os.RemoveAll(dataDir)
	os.Remove(rootFile)
	os.Exit(code)
}

func templateDir() string {
	if v := os.Getenv("CELLFORK_TEMPLATE_DIR"); v != "" {
		return v
	}
	return "/var/lib/cellfork/templates"
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

type lockedBuffer struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// testFlags are the main test daemon's flags; later flags win.
var testFlags = []string{"--max-upload-mb", "1", "-v", "--spill-after", "1s", "--pool-ready", "1", "--pool-shells", "2", "--max-fork", "8",
	"--build-step-timeout", "20s", "--build-disk-mb", "128"}

func startDaemon(dataDir, addr string) (*daemon, error) {
	return startDaemonWith(dataDir, addr)
}

func startDaemonWith(dataDir, addr string, extra ...string) (*daemon, error) {
	return startDaemonBin(filepath.Join(repoRoot, "bin", "cellfork"), dataDir, addr, extra...)
}

// startDaemonBin starts the daemon binary bin (a build of cmd/cellfork)
// with the test flags and extra.
func startDaemonBin(bin, dataDir, addr string, extra ...string) (*daemon, error) {
	return startDaemonEnv(bin, dataDir, addr, nil, extra...)
}

// startDaemonEnv is startDaemonBin with env added to the daemon's
// environment.
func startDaemonEnv(bin, dataDir, addr string, env []string, extra ...string) (*daemon, error) {
	dm := &daemon{url: "http://" + addr, dataDir: dataDir, log: &bytes.Buffer{}, logMu: &sync.Mutex{}}
	args := append([]string{"serve", "--addr", addr, "--data-dir", dataDir, "--template-dir", templateDir()}, testFlags...)
	dm.cmd = exec.Command(bin, append(args, extra...)...)
	dm.cmd.Env = append(append(os.Environ(), "CELLFORK_API_KEY="+apiKey), env...)
	dm.cmd.Stdout = lockedBuffer{dm.logMu, dm.log}
	dm.cmd.Stderr = dm.cmd.Stdout
	if err := dm.cmd.Start(); err != nil {
		return nil, err
	}
	dm.exited = make(chan struct{})
	exited := dm.exited
	go func() { _ = dm.cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Minute) // a first run may build the template
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return nil, fmt.Errorf("daemon exited: %s", dm.logs())
		default:
		}
		if resp, err := http.Get(dm.url + "/health"); err == nil {
			resp.Body.Close()
			return dm, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("daemon did not come up: %s", dm.logs())
}

func (dm *daemon) logs() string {
	dm.logMu.Lock()
	defer dm.logMu.Unlock()
	return dm.log.String()
}

// stop sends SIGTERM and waits: sandboxes survive, as in production.
func (dm *daemon) stop() {
	_ = dm.cmd.Process.Signal(unix.SIGTERM)
	select {
	case <-dm.exited:
	case <-time.After(30 * time.Second):
		fmt.Fprintln(os.Stderr, "the daemon did not stop within 30 s of SIGTERM; killing it")
		_ = dm.cmd.Process.Kill()
		<-dm.exited
	}
}

func loadSpec() error {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(filepath.Join(repoRoot, "internal", "api", "openapi.yaml"))
	if err != nil {
		return fmt.Errorf("loading openapi.yaml: %w", err)
	}
	doc.Servers = nil // match any host
	router, err = legacy.NewRouter(doc)
	return err
}

// response is a decoded HTTP response.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
}

// errMessage returns the message of a JSON error body ("" if none).
func (r response) errMessage() string {
	var e struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Message
}

// call makes a control-plane request with the API key and validates the
// response against the OpenAPI document.
func call(t *testing.T, method, path string, body any) response {
	t.Helper()
	return callWith(t, method, path, body, map[string]string{"X-API-KEY": apiKey})
}

func callWith(t *testing.T, method, path string, body any, headers map[string]string) response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, d.url+path, rd)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := response{status: resp.StatusCode, header: resp.Header, body: raw}
	if resp.Header.Get("X-Request-Id") == "" || !strings.Contains(resp.Header.Get("Server-Timing"), "total;dur=") {
		t.Errorf("%s %s: missing X-Request-Id or Server-Timing: %v", method, path, resp.Header)
	}
	if req.Header.Get("E2b-Sandbox-Id") == "" {
		validate(t, req, out)
	}
	return out
}

// validate checks a control-plane response against the OpenAPI document.
func validate(t *testing.T, req *http.Request, r response) {
	t.Helper()
	route, params, err := router.FindRoute(req)
	if err != nil {
		t.Errorf("%s %s is not in openapi.yaml: %v", req.Method, req.URL.Path, err)
		return
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: r.status,
		Header: r.header, Body: io.NopCloser(bytes.NewReader(r.body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		t.Errorf("%s %s -> %d does not match openapi.yaml: %v\nbody: %s", req.Method, req.URL.Path, r.status, err, r.body)
	}
}

// sandboxInfo is the create/connect response.
type sandboxInfo struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

// create makes a sandbox and registers its kill with t.Cleanup.
func create(t *testing.T, body map[string]any) sandboxInfo {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	if _, ok := body["templateID"]; !ok {
		body["templateID"] = "base"
	}
	r := call(t, "POST", "/v2/sandboxes", body)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var sb sandboxInfo
	r.json(t, &sb)
	t.Cleanup(func() { killQuietly(sb.SandboxID) })
	return sb
}

func killQuietly(id string) {
	req, _ := http.NewRequest("DELETE", d.url+"/sandboxes/"+id, nil)
	req.Header.Set("X-API-KEY", apiKey)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
