package netns

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestCA(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress-ca.pem")
	ca, err := LoadCA(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA file: %v, %v (want mode 0600)", fi.Mode(), err)
	}
	// The certificate handed to sandboxes has no key in it.
	if bytes.Contains(ca.CertPEM(), []byte("PRIVATE KEY")) {
		t.Fatal("CertPEM carries the key")
	}
	block, _ := pem.Decode(ca.CertPEM())
	root, err := x509.ParseCertificate(block.Bytes)
	if err != nil || !root.IsCA || root.PublicKeyAlgorithm != x509.ECDSA {
		t.Fatalf("CA certificate: %v, %v", root, err)
	}
	again, err := LoadCA(path)
	if err != nil || !bytes.Equal(again.CertPEM(), ca.CertPEM()) {
		t.Fatalf("a second start made another CA: %v", err)
	}

	pool := x509.NewCertPool()
	pool.AddCert(root)
	l, err := ca.leaf("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: pool}); err != nil {
		t.Errorf("leaf does not verify: %v", err)
	}
	if _, err := l.Leaf.Verify(x509.VerifyOptions{DNSName: "other.example.com", Roots: pool}); err == nil {
		t.Error("leaf verifies for another name")
	}
	if l.Leaf.NotAfter.After(time.Now().Add(leafValidity + time.Minute)) {
		t.Errorf("leaf valid until %v", l.Leaf.NotAfter)
	}
	if l2, _ := ca.leaf("api.example.com"); l2 != l {
		t.Error("leaf minted again instead of cached")
	}
	if l3, _ := again.leaf("api.example.com"); l3 == nil {
		t.Error("reloaded CA cannot mint")
	} else if _, err := l3.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: pool}); err != nil {
		t.Errorf("reloaded CA's leaf: %v", err)
	}

	// A damaged CA file is an error, not a new CA.
	bad := filepath.Join(t.TempDir(), "bad.pem")
	os.WriteFile(bad, ca.CertPEM(), 0o600)
	if _, err := LoadCA(bad); err == nil {
		t.Error("a CA file without a key loaded")
	}
}
