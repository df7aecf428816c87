package netns

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// CA is the daemon's egress certificate authority. For hosts with network
// rules the egress proxy terminates the sandbox's TLS with a certificate
// the CA signs for the server name, so the sandboxes that have such rules
// trust its certificate (never its key, which stays in the data
// directory). Safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	leafKey *ecdsa.PrivateKey // one key for every leaf: minting is a signature

	mu     sync.Mutex
	leaves map[string]*tls.Certificate // by server name; guarded by mu
}

const (
	caValidity    = 10 * 365 * 24 * time.Hour
	leafValidity  = 7 * 24 * time.Hour
	leafRenew     = 24 * time.Hour // a cached leaf this close to expiry is minted anew
	maxLeaves     = 4096           // the cache is emptied when it reaches this
	caPEMTypeCert = "CERTIFICATE"
	caPEMTypeKey  = "PRIVATE KEY"
)

// LoadCA reads the CA at path (its certificate and PKCS #8 key, PEM), or
// creates one there (ECDSA P-256, mode 0600) if there is none.
func LoadCA(path string) (*CA, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if data, err = createCA(path); err != nil {
			return nil, fmt.Errorf("creating the egress CA %s: %w", path, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("reading the egress CA: %w", err)
	} else if err := os.Chmod(path, 0o600); err != nil {
		return nil, fmt.Errorf("reading the egress CA: %w", err)
	}
	ca, err := parseCA(data)
	if err != nil {
		return nil, fmt.Errorf("reading the egress CA %s: %w", path, err)
	}
	return ca, nil
}

func createCA(path string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "cellfork egress CA " + host, Organization: []string{"cellfork"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	data := append(pem.EncodeToMemory(&pem.Block{Type: caPEMTypeCert, Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: caPEMTypeKey, Bytes: pk})...)
	f, err := os.CreateTemp(filepath.Dir(path), ".egress-ca-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, err
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		return nil, err
	}
	// CreateTemp made it 0600; a link, unlike a rename, never replaces a
	// CA that appeared meanwhile.
	if err := os.Link(f.Name(), path); err != nil {
		return nil, err
	}
	return data, nil
}

func parseCA(data []byte) (*CA, error) {
	var certDER, keyDER []byte
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		switch b.Type {
		case caPEMTypeCert:
			certDER = b.Bytes
		case caPEMTypeKey:
			keyDER = b.Bytes
		}
	}
	if certDER == nil || keyDER == nil {
		return nil, errors.New("want a certificate and a private key (PEM)")
	}
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return nil, err
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("the key is not the certificate's ECDSA key")
	}
	if !cert.IsCA {
		return nil, errors.New("the certificate is not a CA")
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, leafKey: leafKey, leaves: map[string]*tls.Certificate{},
		certPEM: pem.EncodeToMemory(&pem.Block{Type: caPEMTypeCert, Bytes: certDER})}, nil
}

// CertPEM returns the CA's certificate, PEM: what sandboxes trust.
func (c *CA) CertPEM() []byte { return c.certPEM }

// leaf returns a certificate for the server name, signed by the CA,
// minted on first use and cached.
func (c *CA) leaf(name string) (*tls.Certificate, error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaves[name]; ok && now.Add(leafRenew).Before(l.Leaf.NotAfter) {
		return l, nil
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour), // a sandbox's clock may lag a little
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("minting a certificate for %q: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if len(c.leaves) >= maxLeaves {
		clear(c.leaves)
	}
	l := &tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: c.leafKey, Leaf: leaf}
	c.leaves[name] = l
	return l, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n.Add(n, big.NewInt(1))
}
