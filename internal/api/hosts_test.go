package api

import (
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
)

func TestRequestDomain(t *testing.T) {
	for host, want := range map[string]string{
		"127.0.0.1:3000":         "localhost:3000",
		"[::1]:3000":             "localhost:3000",
		"localhost:3000":         "localhost:3000",
		"127.0.0.1":              "localhost",
		"cellfork.internal:8080": "cellfork.internal:8080",
		"sandboxes.example.com":  "sandboxes.example.com",
		"10.1.2.3:3000":          "10.1.2.3:3000",
		"":                       "",
	} {
		if got := RequestDomain(host); got != want {
			t.Errorf("RequestDomain(%q) = %q, want %q", host, got, want)
		}
	}
}

// signedRequest builds a /files request signed with token, as the SDKs do.
func signedRequest(method, path, user, token string, exp int64) *url.Values {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	if exp != 0 {
		q.Set("signature_expiration", strconv.FormatInt(exp, 10))
	}
	r := httptest.NewRequest(method, "/files?"+q.Encode(), nil)
	q.Set("signature", fileSignature(r, token))
	return &q
}

func TestSignedBy(t *testing.T) {
	boxes := []*sandbox.Sandbox{{ID: "a", AccessToken: "tokena"}, {ID: "b", AccessToken: "tokenb"}, {ID: "c"}}
	for _, c := range []struct {
		method, token, want string
		exp                 int64
	}{
		{"GET", "tokena", "a", 0},
		{"POST", "tokenb", "b", 0},
		{"GET", "tokenb", "b", time.Now().Unix() + 60},
		{"GET", "tokenb", "b", time.Now().Unix() - 60}, // expired: routed, then refused by checkSignature
		{"GET", "other", "", 0},
		{"GET", "", "", 0}, // a sandbox without a token is never matched
	} {
		q := signedRequest(c.method, "rel/x.txt", "user", c.token, c.exp)
		r := httptest.NewRequest(c.method, "/files?"+q.Encode(), nil)
		got := signedBy(r, boxes)
		if (got == nil && c.want != "") || (got != nil && got.ID != c.want) {
			t.Errorf("%s signed with %q: got %v, want %q", c.method, c.token, got, c.want)
		}
	}
	// A read signature does not open a write, nor another path or user.
	q := signedRequest("GET", "x", "user", "tokena", 0)
	if signedBy(httptest.NewRequest("POST", "/files?"+q.Encode(), nil), boxes) != nil {
		t.Error("a read signature routed a write")
	}
	q.Set("path", "y")
	if signedBy(httptest.NewRequest("GET", "/files?"+q.Encode(), nil), boxes) != nil {
		t.Error("a signature routed another path")
	}
}

func TestCheckSignature(t *testing.T) {
	now := time.Now().Unix()
	for _, c := range []struct {
		name string
		q    *url.Values
		want string
	}{
		{"valid", signedRequest("GET", "/p", "", "tok", 0), ""},
		{"valid, not expired", signedRequest("GET", "/p", "root", "tok", now+100), ""},
		{"expired", signedRequest("GET", "/p", "", "tok", now-100), "signature is already expired"},
		{"wrong token", signedRequest("GET", "/p", "", "other", 0), "invalid signature"},
		{"wrong token, expired", signedRequest("GET", "/p", "", "other", now-100), "invalid signature"},
	} {
		r := httptest.NewRequest("GET", "/files?"+c.q.Encode(), nil)
		if got := checkSignature(r, "tok"); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	q := signedRequest("GET", "/p", "", "tok", now+100)
	q.Set("signature_expiration", strconv.FormatInt(now+200, 10)) // extended by hand
	if got := checkSignature(httptest.NewRequest("GET", "/files?"+q.Encode(), nil), "tok"); got != "invalid signature" {
		t.Errorf("an extended expiry: %q", got)
	}
}
