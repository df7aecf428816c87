package agent

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testCA returns a CA certificate, PEM.
func testCA(t *testing.T, name string) []byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestTrustCA(t *testing.T) {
	dir := t.TempDir()
	bundle, caFile := filepath.Join(dir, "etc/ca-certificates.crt"), filepath.Join(dir, "share/cellfork.crt")
	orig := append(testCA(t, "system root 1"), testCA(t, "system root 2")...)
	os.MkdirAll(filepath.Dir(bundle), 0o755)
	os.WriteFile(bundle, orig[:len(orig)-1], 0o644) // no final newline
	ca := testCA(t, "cellfork egress CA")

	env, err := TrustCA(ca, bundle, caFile)
	if err != nil {
		t.Fatal(err)
	}
	if env["SSL_CERT_FILE"] != bundle || env["REQUESTS_CA_BUNDLE"] != bundle || env["CURL_CA_BUNDLE"] != bundle || env["NODE_EXTRA_CA_CERTS"] != caFile {
		t.Errorf("env = %v", env)
	}
	got, _ := os.ReadFile(bundle)
	if !bytes.HasPrefix(got, orig) || !bytes.HasSuffix(got, ca) || bytes.Count(got, ca) != 1 {
		t.Fatalf("bundle after the first hand-off:\n%s", got)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(got) {
		t.Fatal("the bundle does not parse")
	}
	if c, _ := os.ReadFile(caFile); !bytes.Equal(c, ca) {
		t.Errorf("CA file = %q", c)
	}
	fi, _ := os.Stat(bundle)
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("bundle mode %v", fi.Mode())
	}

	// Again (a re-hand-off, a sandbox restored from a snapshot): nothing
	// changes, not even the file.
	before, _ := os.Stat(bundle)
	if _, err := TrustCA(ca, bundle, caFile); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(bundle)
	if again, _ := os.ReadFile(bundle); !bytes.Equal(again, got) || !os.SameFile(before, after) {
		t.Error("a second hand-off rewrote the bundle")
	}

	// Another daemon's CA replaces ours, not the system's.
	other := testCA(t, "another cellfork CA")
	if _, err := TrustCA(other, bundle, caFile); err != nil {
		t.Fatal(err)
	}
	got, _ = os.ReadFile(bundle)
	if !bytes.HasPrefix(got, orig) || bytes.Contains(got, ca) || bytes.Count(got, other) != 1 {
		t.Errorf("bundle after another CA:\n%s", got)
	}

	// No bundle yet: one with the CA alone.
	lone := filepath.Join(dir, "new/bundle.crt")
	if _, err := TrustCA(ca, lone, caFile); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(lone); !bytes.HasSuffix(got, ca) {
		t.Errorf("new bundle: %s", got)
	}

	for _, bad := range [][]byte{nil, []byte("not pem"), append(ca, ca...), []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")} {
		if _, err := TrustCA(bad, bundle, caFile); err == nil {
			t.Errorf("TrustCA(%q) accepted", bad)
		}
	}
}
