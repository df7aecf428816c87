package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// domain is the sandbox domain reported to the SDKs (the `domain` of
// create, connect and get), from which they build get_host(port) =
// "{port}-{id}.{domain}". It is --domain when set. Without it, it is the
// address the request reached, so that the name at least points at this
// daemon (never at E2B's default domain): a loopback address becomes
// "localhost:<port>", whose subdomains resolve to the loopback address
// where *.localhost does (RFC 6761: curl, browsers, systemd-resolved).
func (s *Server) domain(r *http.Request) *string {
	if s.cfg.Domain != "" {
		d := s.cfg.Domain
		return &d
	}
	d := RequestDomain(r.Host)
	if d == "" {
		return nil
	}
	return &d
}

// RequestDomain derives the sandbox domain from the Host a request reached
// ("" if it has none): a loopback address is "localhost", the port stays.
// The gateway answers the same way when its region has no domain.
func RequestDomain(host string) string {
	if host == "" {
		return ""
	}
	name, port, err := net.SplitHostPort(host)
	if err != nil {
		name, port = host, ""
	}
	if a, err := netip.ParseAddr(name); (err == nil && a.IsLoopback()) || name == "localhost" {
		name = "localhost"
	}
	if port == "" {
		return name
	}
	return name + ":" + port
}

// signedFilesURL reports whether r is a signed download or upload URL
// (GET or POST /files with a signature) that names no sandbox: what the
// SDKs hand out when they reach the daemon on a single URL
// (E2B_SANDBOX_URL), where download_url/upload_url are that URL plus
// /files?path=...&signature=... and nothing else.
func signedFilesURL(r *http.Request) bool {
	return r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) &&
		r.URL.Query().Get("signature") != ""
}

// signedFiles routes a signed /files URL that names no sandbox. The
// signature does: it is keyed with one sandbox's access token, so the
// sandbox is the one whose token produces it. Nothing else is routed this
// way (only /files, only with a signature that verifies), so the daemon is
// no open proxy, and the proxy checks the signature again, with its expiry.
func (s *Server) signedFiles(w http.ResponseWriter, r *http.Request, reqID string) {
	sandboxes, err := s.m.List(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sb := signedBy(r, sandboxes)
	if sb == nil {
		writeEnvdError(w, http.StatusUnauthorized, "invalid signature")
		return
	}
	s.proxy(w, r, target{sb.ID, envd.Port}, reqID)
}

// signedBy returns the sandbox whose access token signed r, or nil. Every
// candidate is checked in constant time; a token is 128 random bits, so at
// most one can match.
func signedBy(r *http.Request, sandboxes []*sandbox.Sandbox) *sandbox.Sandbox {
	q := r.URL.Query()
	got := []byte(q.Get("signature"))
	var found *sandbox.Sandbox
	for _, sb := range sandboxes {
		if sb.AccessToken == "" {
			continue
		}
		if subtle.ConstantTimeCompare(got, []byte(fileSignature(r, sb.AccessToken))) == 1 {
			found = sb
		}
	}
	return found
}

// fileSignature is E2B's signature of a /files URL (spec §4.1):
// "v1_" + base64(sha256("path:operation:username:token[:expiration]")),
// operation "read" for GET and "write" for POST.
func fileSignature(r *http.Request, token string) string {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	payload := fmt.Sprintf("%s:%s:%s:%s", q.Get("path"), op, q.Get("username"), token)
	if exp := q.Get("signature_expiration"); exp != "" {
		payload += ":" + exp
	}
	sum := sha256.Sum256([]byte(payload))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// checkSignature verifies a signed /files URL against token, as envd does:
// the signature first, then its expiry. It returns "" when it holds, else
// envd's message.
func checkSignature(r *http.Request, token string) string {
	q := r.URL.Query()
	exp := q.Get("signature_expiration")
	var expiry int64
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return "invalid signature_expiration"
		}
		expiry = n
	}
	if subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(fileSignature(r, token))) != 1 {
		return "invalid signature"
	}
	if exp != "" && expiry < time.Now().Unix() {
		return "signature is already expired"
	}
	return ""
}

// writeEnvdError answers as envd does ({"code", "message"}): the SDKs and
// E2B's tests compare signed-URL refusals with exactly that.
func writeEnvdError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}
