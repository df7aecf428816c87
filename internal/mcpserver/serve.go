package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cellfork/cellfork/internal/client"
)

const usage = `usage: cellfork mcp [--url URL] [--api-key KEY] [--http ADDR]

Serve the Model Context Protocol: tools to create sandboxes, run code and
commands in them, read, write and list their files, snapshot, fork, roll
back, pause and kill them, and a resource for each sandbox file
(cellfork://sandboxes/{sandbox_id}/files/{path}). It calls the daemon's
HTTP API at --url.

Over stdio (the default) it uses --api-key. With --http it serves MCP's
streamable HTTP transport at http://ADDR/mcp instead, and each client
sends its own API key ("Authorization: Bearer KEY" or X-API-KEY).

flags:
`

// Main runs `cellfork mcp` and returns its exit code.
func Main(ctx context.Context, args []string, stderr io.Writer, version string) int {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	url := fs.String("url", envOr("CELLFORK_URL", "http://127.0.0.1:3000"), "the daemon's (or gateway's) URL (env CELLFORK_URL)")
	key := fs.String("api-key", os.Getenv("CELLFORK_API_KEY"), "API key for stdio (env CELLFORK_API_KEY)")
	addr := fs.String("http", "", "serve streamable HTTP on this address (e.g. 127.0.0.1:3600) instead of stdio")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "cellfork mcp: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var err error
	if *addr != "" {
		err = ServeHTTP(ctx, *addr, *url, version, log, stderr)
	} else {
		err = ServeStdio(ctx, *url, *key, version)
	}
	if err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "cellfork mcp: %v\n", err)
		return 1
	}
	return 0
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// ServeStdio serves one client over stdin and stdout until it goes away.
func ServeStdio(ctx context.Context, url, key, version string) error {
	if key == "" {
		return errors.New("no API key: set CELLFORK_API_KEY or pass --api-key")
	}
	c, err := client.New(url, key, nil)
	if err != nil {
		return err
	}
	c.UserAgent = "cellfork-mcp/" + version
	return NewServer(c, version).Run(ctx, &mcp.StdioTransport{})
}

// ServeHTTP serves the streamable HTTP transport at /mcp on addr until ctx
// ends.
func ServeHTTP(ctx context.Context, addr, url, version string, log *slog.Logger, out io.Writer) error {
	h, err := Handler(url, version, log, nil)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	fmt.Fprintf(out, "cellfork mcp: serving streamable HTTP on http://%s/mcp\n", ln.Addr())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Handler is the streamable HTTP transport: every request carries an API
// key, checked against the API at url (and remembered for a minute); a
// session belongs to the key that opened it, and its tools use that key.
func Handler(url, version string, log *slog.Logger, rt http.RoundTripper) (http.Handler, error) {
	if _, err := client.New(url, "", rt); err != nil {
		return nil, err
	}
	v := &verifier{url: url, rt: rt, ok: map[string]time.Time{}}
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		ti := auth.TokenInfoFromContext(r.Context())
		if ti == nil {
			return nil // not reached: the middleware refused the request
		}
		c, _ := client.New(url, ti.Extra["key"].(string), rt)
		c.UserAgent = "cellfork-mcp/" + version
		return NewServer(c, version)
	}, &mcp.StreamableHTTPOptions{Logger: log, SessionTimeout: 30 * time.Minute})
	protected := auth.RequireBearerToken(v.verify, nil)(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// X-API-KEY, as the daemon takes it, works too.
		if k := r.Header.Get("X-API-KEY"); k != "" && r.Header.Get("Authorization") == "" {
			r.Header.Set("Authorization", "Bearer "+k)
		}
		protected.ServeHTTP(w, r)
	}), nil
}

// verifier checks API keys against the API. Safe for concurrent use.
type verifier struct {
	url string
	rt  http.RoundTripper
	mu  sync.Mutex
	ok  map[string]time.Time // key hash -> when last confirmed
}

// keyTTL is how long a confirmed key is trusted without asking again.
const keyTTL = time.Minute

func (v *verifier) verify(ctx context.Context, key string, _ *http.Request) (*auth.TokenInfo, error) {
	sum := sha256.Sum256([]byte(key))
	id := hex.EncodeToString(sum[:16])
	info := &auth.TokenInfo{UserID: id, Expiration: time.Now().Add(time.Hour), Extra: map[string]any{"key": key}}
	v.mu.Lock()
	at, ok := v.ok[id]
	v.mu.Unlock()
	if ok && time.Since(at) < keyTTL {
		return info, nil
	}
	c, err := client.New(v.url, key, v.rt)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The cheapest call that needs the key.
	if _, err := c.Do(ctx, http.MethodGet, "/v2/sandboxes", map[string][]string{"limit": {"1"}}, nil, nil); err != nil {
		var ae *client.Error
		if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
			return nil, fmt.Errorf("%w: the API refused this key", auth.ErrInvalidToken)
		}
		return nil, fmt.Errorf("checking the API key: %w", err)
	}
	v.mu.Lock()
	v.ok[id] = time.Now()
	v.mu.Unlock()
	return info, nil
}
