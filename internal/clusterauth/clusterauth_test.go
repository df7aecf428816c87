package clusterauth

import (
	"errors"
	"net/http/httptest"
	"testing"
	"time"
)

func TestSignVerify(t *testing.T) {
	key, other := []byte("0123456789abcdef0123456789abcdef"), []byte("fedcba9876543210fedcba9876543210")
	now := time.Now()
	r := httptest.NewRequest("POST", "/v2/sandboxes?x=1", nil)
	Sign(r, key, "acme", "c0100100000000000000", now)
	c, err := Verify(r, [][]byte{other, key}, now.Add(time.Second))
	if err != nil || c.Team != "acme" || c.Mint != "c0100100000000000000" {
		t.Fatalf("Verify = %+v, %v", c, err)
	}
	for name, tamper := range map[string]func(){
		"team":   func() { r.Header.Set(HeaderTeam, "evil") },
		"mint":   func() { r.Header.Set(HeaderMint, "c0100100000000000001") },
		"path":   func() { r.URL.Path = "/sandboxes/x" },
		"method": func() { r.Method = "DELETE" },
	} {
		saved := r.Clone(r.Context())
		tamper()
		if _, err := Verify(r, [][]byte{key}, now); !errors.Is(err, ErrBadSig) {
			t.Errorf("tampered %s: %v", name, err)
		}
		r = saved
	}
	if _, err := Verify(r, [][]byte{key}, now.Add(2*MaxSkew)); !errors.Is(err, ErrStale) {
		t.Errorf("stale: %v", err)
	}
	if _, err := Verify(httptest.NewRequest("GET", "/", nil), [][]byte{key}, now); !errors.Is(err, ErrUnsigned) {
		t.Errorf("unsigned: %v", err)
	}
}
