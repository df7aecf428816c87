package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/errdefs"
)

// caller is who a control-plane request comes from.
type caller struct {
	team    clusterdb.Team
	regions []string // the key's or token's own bound on regions (empty: the team's)
	max     int      // a token's bound on running sandboxes (0: the team's)
	via     string   // "key" or "jwt"
}

// cachedKey is what the gateway remembers of a key.
type cachedKey struct {
	Key   clusterdb.Key `json:"key"`
	Found bool          `json:"found"`
	At    time.Time     `json:"at"`
}

// keyCache remembers API keys by hash for a while: a request with a known
// key reads no database. Revocation reaches it by NOTIFY at once, or after
// the TTL. Safe for concurrent use.
type keyCache struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[string]cachedKey
}

func (c *keyCache) get(hash string) (cachedKey, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[hash]
	return e, ok
}

func (c *keyCache) put(hash string, e cachedKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]cachedKey{}
	}
	c.m[hash] = e
}

func (c *keyCache) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m = nil
}

func (c *keyCache) export() map[string]cachedKey {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]cachedKey{}
	for k, v := range c.m {
		if v.Found && !v.Key.Revoked {
			out[k] = v
		}
	}
	return out
}

func (c *keyCache) load(m map[string]cachedKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m = m
}

// Auth failures by reason (metrics name these).
const (
	authMissing = "missing"
	authUnknown = "unknown key"
	authRevoked = "revoked key"
	authJWT     = "bad token"
	authNoTeam  = "no such team"
)

// authError is a 401 with its reason.
type authError struct {
	reason, msg string
}

func (e *authError) Error() string { return e.msg }

// authenticate reads X-API-KEY or a bearer JWT.
func (g *Gateway) authenticate(r *http.Request) (caller, error) {
	if key := r.Header.Get("X-API-KEY"); key != "" {
		return g.byKey(r.Context(), key)
	}
	if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer ") {
		return g.byJWT(strings.TrimPrefix(h, "Bearer "))
	}
	return caller{}, &authError{authMissing, "missing API key: send it in the X-API-KEY header (or a token in Authorization: Bearer)"}
}

func (g *Gateway) byKey(ctx context.Context, key string) (caller, error) {
	hash := clusterdb.HashKey(key)
	hexHash := hex.EncodeToString(hash)
	e, ok := g.keys.get(hexHash)
	if !ok || time.Since(e.At) > g.cfg.KeyTTL {
		db := g.db.Load()
		if db == nil && !ok {
			return caller{}, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later")
		}
		if db != nil {
			k, err := db.LookupKey(ctx, hash)
			switch {
			case err == nil:
				e = cachedKey{Key: k, Found: true, At: time.Now()}
				g.keys.put(hexHash, e)
			case errors.Is(err, errdefs.ErrNotFound):
				e = cachedKey{At: time.Now()}
				g.keys.put(hexHash, e)
			case !ok:
				return caller{}, err
			}
			// The database did not answer: a key it knew a moment ago stands.
		}
	}
	switch {
	case !e.Found:
		return caller{}, &authError{authUnknown, "invalid API key"}
	case e.Key.Revoked:
		return caller{}, &authError{authRevoked, "this API key was revoked"}
	}
	t, ok := g.view.Load().Teams[e.Key.Team]
	if !ok {
		return caller{}, &authError{authNoTeam, "the API key's team does not exist"}
	}
	return caller{team: t, regions: e.Key.Regions, via: "key"}, nil
}

// claims are a cellfork JWT's: the team it acts for, and optional bounds.
type claims struct {
	Team         string   `json:"team"`
	Regions      []string `json:"regions"`
	MaxSandboxes int      `json:"max_sandboxes"`
	jwt.RegisteredClaims
}

func (g *Gateway) byJWT(token string) (caller, error) {
	if len(g.cfg.JWTKeys) == 0 {
		return caller{}, &authError{authJWT, "bearer tokens are not accepted by this gateway (no --jwt-public-key)"}
	}
	var c claims
	var lastErr error
	for _, k := range g.cfg.JWTKeys {
		_, err := jwt.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) { return k, nil },
			jwt.WithValidMethods([]string{"EdDSA", "ES256"}), jwt.WithExpirationRequired())
		if err == nil {
			lastErr = nil
			break
		}
		lastErr = err
	}
	if lastErr != nil {
		return caller{}, &authError{authJWT, "invalid bearer token: " + lastErr.Error()}
	}
	t, ok := g.view.Load().Teams[c.Team]
	if !ok {
		return caller{}, &authError{authNoTeam, fmt.Sprintf("the token's team %q does not exist", c.Team)}
	}
	return caller{team: t, regions: c.Regions, max: c.MaxSandboxes, via: "jwt"}, nil
}

// LoadJWTKey reads a PEM public key (Ed25519 or ECDSA P-256).
func LoadJWTKey(path string) (any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch k := k.(type) {
	case ed25519.PublicKey:
		return k, nil
	case *ecdsa.PublicKey:
		if k.Curve.Params().Name != "P-256" {
			return nil, fmt.Errorf("%s: an ECDSA key must be P-256 (ES256)", path)
		}
		return k, nil
	}
	return nil, fmt.Errorf("%s: an Ed25519 or ECDSA P-256 public key is needed", path)
}

// allows reports whether region may hold the caller's sandboxes: the
// team's policy, narrowed by the key's or token's (names of regions or of
// their groups; empty allows all).
func (c caller) allows(r clusterdb.Region) bool {
	in := func(list []string) bool {
		return len(list) == 0 || slices.Contains(list, r.Name) || slices.ContainsFunc(r.Groups, func(g string) bool { return slices.Contains(list, g) })
	}
	return in(c.team.Regions) && in(c.regions)
}

// policy words the caller's location policy for an error.
func (c caller) policy() string {
	parts := []string{}
	if len(c.team.Regions) > 0 {
		parts = append(parts, fmt.Sprintf("team %s allows %s", c.team.ID, strings.Join(c.team.Regions, ", ")))
	}
	if len(c.regions) > 0 {
		parts = append(parts, fmt.Sprintf("its %s allows %s", map[string]string{"key": "API key", "jwt": "token"}[c.via], strings.Join(c.regions, ", ")))
	}
	return strings.Join(parts, "; ")
}
