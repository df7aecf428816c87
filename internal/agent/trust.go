package agent

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Where a sandbox keeps its trust in the daemon's egress CA (Debian's
// layout: update-ca-certificates rebuilds SystemBundle from the
// certificates under /usr/local/share/ca-certificates, EgressCAFile among
// them).
const (
	SystemBundle = "/etc/ssl/certs/ca-certificates.crt"
	EgressCAFile = "/usr/local/share/ca-certificates/cellfork-egress-ca.crt"
)

// caMarker starts the block TrustCA appends to the bundle.
const caMarker = "# cellfork egress CA (added by cellfork-agent at hand-off)\n"

// TrustCA makes the system trust certPEM, a CA certificate: it is written
// to caFile and appended to bundle, whose other certificates stay as they
// are. It is idempotent (a bundle that has it already is not written; one
// with an older cellfork CA gets this one instead), and the files are
// replaced atomically. It returns the environment that points common
// clients (OpenSSL and Python's ssl, requests and pip, curl, Node) at the
// bundle and the certificate.
func TrustCA(certPEM []byte, bundle, caFile string) (map[string]string, error) {
	block, rest := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) > 0 {
		return nil, errors.New("caCert: want one PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil || !cert.IsCA {
		return nil, errors.New("caCert: not a CA certificate")
	}
	certPEM = pem.EncodeToMemory(block) // normalised
	if err := writeIfChanged(caFile, certPEM); err != nil {
		return nil, err
	}
	old, err := os.ReadFile(bundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	kept := withoutOurBlock(old)
	if len(kept) > 0 && kept[len(kept)-1] != '\n' {
		kept = append(kept, '\n')
	}
	if err := writeIfChanged(bundle, append(append(kept, caMarker...), certPEM...)); err != nil {
		return nil, err
	}
	return map[string]string{
		"SSL_CERT_FILE":       bundle,
		"REQUESTS_CA_BUNDLE":  bundle,
		"CURL_CA_BUNDLE":      bundle,
		"NODE_EXTRA_CA_CERTS": caFile,
	}, nil
}

// withoutOurBlock returns bundle without the blocks TrustCA added.
func withoutOurBlock(bundle []byte) []byte {
	end := []byte("-----END CERTIFICATE-----\n")
	for {
		i := bytes.Index(bundle, []byte(caMarker))
		if i < 0 {
			return bundle
		}
		j := bytes.Index(bundle[i:], end)
		if j < 0 {
			return bundle[:i]
		}
		bundle = append(bundle[:i:i], bundle[i+j+len(end):]...)
	}
}

// writeIfChanged replaces path with data (mode 0644) through a file
// renamed into place, unless it holds data already.
func writeIfChanged(path string, data []byte) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".cellfork-ca-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	if err = errors.Join(err, f.Chmod(0o644), f.Close()); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return os.Rename(f.Name(), path)
}
