package envd

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// /init's caCert: the CA joins the bundle, the processes the agent starts
// are pointed at it, and variables the caller set win.
func TestInitTrustsCA(t *testing.T) {
	dir := t.TempDir()
	old := trustPaths
	trustPaths.bundle, trustPaths.caFile = filepath.Join(dir, "bundle.crt"), filepath.Join(dir, "ca.crt")
	t.Cleanup(func() { trustPaths = old })
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})

	e := newEnv(t)
	body, _ := json.Marshal(map[string]any{"caCert": string(ca), "envVars": map[string]string{"CURL_CA_BUNDLE": "/mine.crt"}})
	if res, b := e.do("POST", "/init", nil, bytes.NewReader(body), nil); res.StatusCode != 204 {
		t.Fatalf("init %d %s", res.StatusCode, b)
	}
	envs := e.settings.Envs()
	if envs["SSL_CERT_FILE"] != trustPaths.bundle || envs["REQUESTS_CA_BUNDLE"] != trustPaths.bundle ||
		envs["NODE_EXTRA_CA_CERTS"] != trustPaths.caFile || envs["CURL_CA_BUNDLE"] != "/mine.crt" {
		t.Errorf("envs = %v", envs)
	}
	if got, _ := os.ReadFile(trustPaths.bundle); !bytes.HasSuffix(got, ca) {
		t.Errorf("bundle = %s", got)
	}
	// A later /init keeps a variable the caller set then.
	e.settings.Init("", "", map[string]string{"SSL_CERT_FILE": "/set-later.crt"})
	if res, b := e.do("POST", "/init", nil, bytes.NewReader(body), nil); res.StatusCode != 204 {
		t.Fatalf("init %d %s", res.StatusCode, b)
	}
	if got := e.settings.Envs()["SSL_CERT_FILE"]; got != "/set-later.crt" {
		t.Errorf("SSL_CERT_FILE = %q after a second /init", got)
	}
	res, b := e.do("POST", "/init", nil, strings.NewReader(`{"caCert":"not a certificate"}`), nil)
	wantAPIError(t, res, b, 400)
}
