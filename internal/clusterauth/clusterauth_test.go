package clusterauth

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
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

// Call's request checks on the host's side, for its team; the answer
// comes back whole up to MaxAnswer.
func TestCall(t *testing.T) {
	key := []byte("internal key")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := Verify(r, [][]byte{key}, time.Now())
		if err != nil || c.Team != "acme" || c.Mint != "" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "refused", http.StatusUnauthorized)
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		w.Write(append(body, bytes.Repeat([]byte("x"), MaxAnswer)...))
	}))
	defer srv.Close()
	status, body, err := Call(context.Background(), http.DefaultTransport, key, "acme", http.MethodPost, srv.URL+"/sandboxes/x/pause?a=b", []byte(`{"spill":true}`))
	if err != nil || status != http.StatusCreated || len(body) != MaxAnswer || !bytes.HasPrefix(body, []byte(`{"spill":true}x`)) {
		t.Fatalf("call: %d %d bytes %v", status, len(body), err)
	}
	if status, _, err := Call(context.Background(), http.DefaultTransport, []byte("another key"), "acme", http.MethodGet, srv.URL+"/", nil); err != nil || status != http.StatusUnauthorized {
		t.Fatalf("a call signed with another key: %d %v", status, err)
	}
}

// A peer's signature and a gateway's never check as each other: a
// gateway's signature on a client's call does not open a host's images.
func TestPeerPurpose(t *testing.T) {
	key, now := []byte("internal key"), time.Now()
	r := httptest.NewRequest("GET", "/internal/images/chunks/ab/ab12", nil)
	SignPeer(r, key, "acme", now)
	if c, err := VerifyPeer(r, [][]byte{key}, now); err != nil || c.Team != "acme" {
		t.Fatalf("VerifyPeer = %+v, %v", c, err)
	}
	if _, err := Verify(r, [][]byte{key}, now); !errors.Is(err, ErrBadSig) {
		t.Errorf("a peer's signature checked as a gateway's: %v", err)
	}
	g := httptest.NewRequest("GET", "/internal/images/chunks/ab/ab12", nil)
	Sign(g, key, "acme", "", now)
	if _, err := VerifyPeer(g, [][]byte{key}, now); !errors.Is(err, ErrBadSig) {
		t.Errorf("a gateway's signature checked as a peer's: %v", err)
	}
	if _, err := VerifyPeer(httptest.NewRequest("GET", "/internal/images/manifests/x", nil), [][]byte{key}, now); !errors.Is(err, ErrUnsigned) {
		t.Errorf("unsigned: %v", err)
	}
}
