// Package cluster tests a real cluster on one machine (test/cluster/harness):
// PostgreSQL, three hosts in their own network namespaces (two in region
// eu, one in us) running real gVisor sandboxes, and a gateway per region;
// through real HTTP and the official E2B SDK. Tests run in order: the last
// ones break things (a database outage, a partition, a host killed).
package cluster

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/telemetry/otlptest"
	"github.com/cellfork/cellfork/test/cluster/harness"
)

// The hosts' chunk store collection.
const storeGCInterval, storeGCGrace = 2 * time.Second, 10 * time.Second

var (
	c        *harness.Cluster
	traces   = &otlptest.Collector{} // what the hosts and gateways trace
	repoRoot string
	edKey    ed25519.PrivateKey
	ecKey    *ecdsa.PrivateKey
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "cluster tests need root (network namespaces, gVisor, PostgreSQL as its user)")
		os.Exit(1)
	}
	wd, _ := os.Getwd()
	repoRoot = filepath.Join(wd, "..", "..")
	bin := filepath.Join(repoRoot, "bin", "cellfork")
	if _, err := os.Stat(bin); err != nil {
		fmt.Fprintln(os.Stderr, "bin/cellfork missing: run `make build` (make test does)")
		os.Exit(1)
	}
	dir, _ := os.MkdirTemp("", "cellfork-cluster-test-")
	gwFlags, err := jwtKeys(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tpl := os.Getenv("CELLFORK_TEMPLATE_DIR")
	if tpl == "" {
		tpl = "/var/lib/cellfork/templates"
	}
	var logs io.Writer
	if os.Getenv("CELLFORK_CLUSTER_LOGS") != "" {
		logs = os.Stderr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	c, err = harness.Start(ctx, harness.Options{Dir: dir, Bin: bin, TemplateDir: tpl, GatewayFlags: gwFlags, S3: true, Traces: traces, Log: logs,
		// The hosts collect their shared store often, with a short grace
		// period: every test runs beside collections.
		HostFlags: []string{"--store-gc-interval", storeGCInterval.String(), "--store-gc-grace", storeGCGrace.String()}})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the cluster:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		for _, p := range []*harness.Proc{&c.Hosts[0].Proc, &c.Hosts[1].Proc, &c.Hosts[2].Proc, c.Gateways["eu"], c.Gateways["us"]} {
			logs := p.Logs()
			if len(logs) > 3000 {
				logs = logs[len(logs)-3000:]
			}
			fmt.Fprintf(os.Stderr, "--- %s (tail)\n%s\n", p.Name, logs)
		}
	}
	c.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

// jwtKeys makes an Ed25519 and an ECDSA P-256 key and returns the gateway
// flags that trust their public halves.
func jwtKeys(dir string) ([]string, error) {
	var err error
	_, edKey, err = ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	if ecKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	var flags []string
	for name, pub := range map[string]any{"ed.pem": edKey.Public(), "ec.pem": &ecKey.PublicKey} {
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
			return nil, err
		}
		flags = append(flags, "--jwt-public-key", p)
	}
	return flags, nil
}

// resp is an answer.
type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
}

var client = &http.Client{Timeout: 60 * time.Second}

// do makes a request to region's gateway with the team's key (unless the
// headers say otherwise).
func do(t *testing.T, region, method, path string, body any, headers map[string]string) resp {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.URL(region)+path, rd)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-KEY", c.Key)
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	r, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{r.StatusCode, r.Header, b}
}

// sandbox is a created sandbox.
type sandbox struct {
	ID    string `json:"sandboxID"`
	Token string `json:"envdAccessToken"`
}

// create makes a sandbox through region's gateway and kills it at the
// end of the test.
func create(t *testing.T, region string, body map[string]any) sandbox {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	if _, ok := body["templateID"]; !ok {
		body["templateID"] = "base"
	}
	if _, ok := body["timeout"]; !ok {
		body["timeout"] = 300
	}
	r := do(t, region, "POST", "/v2/sandboxes", body, nil)
	if r.status != http.StatusCreated {
		t.Fatalf("create in %s: %d %s", region, r.status, r.body)
	}
	var sb sandbox
	r.json(t, &sb)
	t.Cleanup(func() { do(t, region, "DELETE", "/sandboxes/"+sb.ID, nil, nil) })
	return sb
}

// runCode runs code in the sandbox through region's gateway and returns
// its stdout.
func runCode(t *testing.T, region string, sb sandbox, code string) (string, int) {
	t.Helper()
	return runCodeWith(t, region, sb, code, nil)
}

// runCodeWith is runCode with more headers.
func runCodeWith(t *testing.T, region string, sb sandbox, code string, headers map[string]string) (string, int) {
	t.Helper()
	h := map[string]string{"E2b-Sandbox-Id": sb.ID, "E2b-Sandbox-Port": "49999", "X-Access-Token": sb.Token, "X-API-KEY": ""}
	for k, v := range headers {
		h[k] = v
	}
	r := do(t, region, "POST", "/execute", map[string]any{"code": code}, h)
	var out strings.Builder
	for _, line := range bytes.Split(r.body, []byte("\n")) {
		var ev struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(line, &ev) == nil && ev.Type == "stdout" {
			out.WriteString(ev.Text)
		}
	}
	return out.String(), r.status
}

// eventually polls cond until it holds.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func ecdsaKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
