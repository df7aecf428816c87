// Package clusterauth signs a gateway's calls to a host and checks them: a
// cluster host answers only requests a gateway signed with the cluster's
// internal key (HMAC-SHA256 over the method, the path and query, a
// timestamp, the team the call acts for and the id a create is to take).
// Run the internal network over TLS: the signature authenticates the call,
// it does not hide or bind the body.
package clusterauth

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Headers of a signed call.
const (
	HeaderTime = "Cellfork-Gateway-Time" // Unix milliseconds
	HeaderTeam = "Cellfork-Team"         // the team the call acts for
	HeaderMint = "Cellfork-Mint"         // the id a create takes ("" none)
	HeaderSig  = "Cellfork-Gateway-Sig"
)

// MaxSkew bounds how old (or early) a signed call may be.
const MaxSkew = time.Minute

// Caller is who a host's request came from.
type Caller struct {
	Team string // the team the gateway acts for
	Mint string // the id a create is to take
}

// The purposes a signature is made for: a gateway's call to a host, and a
// call to a host's image endpoints (a peer's). One never checks as the
// other, so a gateway that signs a client's call to a host (any path, the
// data plane's included) never opens a host's images to it.
const (
	purposeGateway = "cellfork/internal/v1"
	purposePeer    = "cellfork/peer/v1"
)

func mac(key []byte, purpose, method, uri, ts, team, mint string) string {
	m := hmac.New(sha256.New, key)
	for _, s := range []string{purpose, method, uri, ts, team, mint} {
		m.Write([]byte(s))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}

// Sign signs r (as sent: its method and RequestURI-equivalent) for team.
func Sign(r *http.Request, key []byte, team, mint string, now time.Time) {
	sign(r, purposeGateway, key, team, mint, now)
}

// SignPeer signs r as a call to a host's image endpoints (a host fetching
// an image from another, or a gateway asking a host to offer one), for
// team ("" for none).
func SignPeer(r *http.Request, key []byte, team string, now time.Time) {
	sign(r, purposePeer, key, team, "", now)
}

func sign(r *http.Request, purpose string, key []byte, team, mint string, now time.Time) {
	ts := strconv.FormatInt(now.UnixMilli(), 10)
	r.Header.Set(HeaderTime, ts)
	r.Header.Set(HeaderTeam, team)
	if mint != "" {
		r.Header.Set(HeaderMint, mint)
	} else {
		r.Header.Del(HeaderMint)
	}
	r.Header.Set(HeaderSig, mac(key, purpose, r.Method, r.URL.RequestURI(), ts, team, mint))
}

// Errors a call that is not a gateway's gets.
var (
	ErrUnsigned = errors.New("this host takes calls only from the cluster's gateways")
	ErrBadSig   = errors.New("the gateway signature does not check")
	ErrStale    = errors.New("the gateway signature is too old or too new (clock skew?)")
)

// Verify checks a received request's signature against keys (current
// first) and returns who it came from.
func Verify(r *http.Request, keys [][]byte, now time.Time) (Caller, error) {
	return verifyFor(r, purposeGateway, keys, now)
}

// VerifyPeer checks a signature SignPeer made (a gateway's, Sign, does
// not check).
func VerifyPeer(r *http.Request, keys [][]byte, now time.Time) (Caller, error) {
	return verifyFor(r, purposePeer, keys, now)
}

func verifyFor(r *http.Request, purpose string, keys [][]byte, now time.Time) (Caller, error) {
	sig, ts := r.Header.Get(HeaderSig), r.Header.Get(HeaderTime)
	if sig == "" || ts == "" {
		return Caller{}, ErrUnsigned
	}
	ms, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return Caller{}, ErrBadSig
	}
	if d := now.Sub(time.UnixMilli(ms)); d > MaxSkew || d < -MaxSkew {
		return Caller{}, ErrStale
	}
	c := Caller{Team: r.Header.Get(HeaderTeam), Mint: r.Header.Get(HeaderMint)}
	for _, k := range keys {
		if hmac.Equal([]byte(sig), []byte(mac(k, purpose, r.Method, r.URL.RequestURI(), ts, c.Team, c.Mint))) {
			return c, nil
		}
	}
	return Caller{}, ErrBadSig
}

// Strip removes the internal headers from a request that came from
// outside, so a client cannot pass them through a gateway.
func Strip(h http.Header) {
	for k := range h {
		if strings.HasPrefix(http.CanonicalHeaderKey(k), "Cellfork-") {
			h.Del(k)
		}
	}
}

// MaxAnswer bounds the body Call reads.
const MaxAnswer = 1 << 20

// NewRequest makes a call to a host with a JSON body, signed with key for
// team (and mint, the id a create takes; "" for any other call).
func NewRequest(ctx context.Context, key []byte, team, mint, method, url string, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	Sign(req, key, team, mint, time.Now())
	return req, nil
}

// Call sends a call signed with key for team (NewRequest, no id minted)
// to url through rt, and returns the answer's status and body (at most
// MaxAnswer bytes).
func Call(ctx context.Context, rt http.RoundTripper, key []byte, team, method, url string, body []byte) (int, []byte, error) {
	req, err := NewRequest(ctx, key, team, "", method, url, body)
	if err != nil {
		return 0, nil, err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswer))
	return resp.StatusCode, b, err
}
