// Package client calls a cellfork daemon's (or gateway's) public HTTP API
// with an API key: the control plane as JSON, and the data-plane requests
// that reach a sandbox's agent through the daemon (routing headers and the
// sandbox's access token), with the wire types generated from the API's
// OpenAPI description (internal/api/apitypes). The CLI and the MCP server
// use it; like them it must not link daemon code (internal/cli/deps_test.go).
package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/api/apitypes"
)

const (
	// controlTimeout bounds one control-plane call (create may cold-start).
	controlTimeout = 2 * time.Minute
	// maxErrorBody is how much of an error response body is read.
	maxErrorBody = 64 << 10
)

// Error is an error answer from the daemon: a JSON body
// {"code":int,"message":str} (or plain text) and an X-Request-Id header.
type Error struct {
	Status    int
	Message   string
	RequestID string
}

func (e *Error) Error() string {
	if e.RequestID == "" {
		return e.Message
	}
	return fmt.Sprintf("%s (request %s)", e.Message, e.RequestID)
}

// ParseError builds an Error from a non-2xx response's status, headers
// and (already read) body. The message is the JSON "message" if there is
// one, else the body text, else the HTTP status.
func ParseError(status int, h http.Header, body []byte) *Error {
	e := &Error{Status: status, RequestID: h.Get("X-Request-Id")}
	var wire struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &wire) == nil && wire.Message != "" {
		e.Message = wire.Message
		return e
	}
	if text := strings.TrimSpace(string(body)); text != "" {
		e.Message = fmt.Sprintf("%d %s: %s", status, http.StatusText(status), text)
		return e
	}
	e.Message = fmt.Sprintf("%d %s", status, http.StatusText(status))
	return e
}

// ErrorFromResponse reads resp's body into an Error.
func ErrorFromResponse(resp *http.Response) *Error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return ParseError(resp.StatusCode, resp.Header, body)
}

// ReachError rewords a transport failure for the user.
func ReachError(base string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("cannot reach the daemon at %s: %w", base, err)
}

// Client calls the API. Safe for concurrent use.
type Client struct {
	Base      string // no trailing slash
	Key       string
	HTTP      *http.Client
	UserAgent string
}

// New returns a client of the API at base (http or https URL) with key,
// over rt (nil: http.DefaultTransport).
func New(base, key string, rt http.RoundTripper) (*Client, error) {
	base = strings.TrimRight(base, "/")
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("invalid URL %q: want http(s)://host[:port]", base)
	}
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &Client{Base: base, Key: key, HTTP: &http.Client{Transport: rt}, UserAgent: "cellfork"}, nil
}

// Do sends a control-plane request with a JSON body (if body != nil) and
// decodes a 2xx JSON answer into out (if out != nil). It returns the
// response headers, or an *Error for non-2xx answers.
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, body, out any) (http.Header, error) {
	_, h, err := c.Call(ctx, method, path, query, body, out)
	return h, err
}

// Call is Do that also returns the response's status code (0 if there was
// no response).
func (c *Client) Call(ctx context.Context, method, path string, query url.Values, body, out any) (int, http.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, fmt.Errorf("encoding request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	target := c.Base + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return 0, nil, fmt.Errorf("building request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Key != "" {
		req.Header.Set("X-API-KEY", c.Key)
	}
	req.Header.Set("User-Agent", c.UserAgent)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, ReachError(c.Base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, resp.Header, ErrorFromResponse(resp)
	}
	if out == nil {
		return resp.StatusCode, resp.Header, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return resp.StatusCode, resp.Header, fmt.Errorf("decoding %s %s response: %w", method, path, err)
	}
	return resp.StatusCode, resp.Header, nil
}

// Connect connects to sandbox id (resuming it if paused) and returns it.
func (c *Client) Connect(ctx context.Context, id string) (*apitypes.Sandbox, error) {
	var sb apitypes.Sandbox
	path := "/v2/sandboxes/" + url.PathEscape(id) + "/connect"
	if _, err := c.Do(ctx, http.MethodPost, path, nil, apitypes.ConnectRequest{}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// AccessToken connects to sandbox id (resuming it if paused) and returns
// its data-plane access token.
func (c *Client) AccessToken(ctx context.Context, id string) (string, error) {
	sb, err := c.Connect(ctx, id)
	if err != nil {
		return "", err
	}
	return sb.EnvdAccessToken, nil
}

// SetDataHeaders sets the data-plane routing and auth headers of a
// request to port inside sandbox id (user "" = the sandbox's default).
func SetDataHeaders(h http.Header, id string, port int, token, user string) {
	h.Set("E2b-Sandbox-Id", id)
	h.Set("E2b-Sandbox-Port", strconv.Itoa(port))
	if token != "" {
		h.Set("X-Access-Token", token)
	}
	if user != "" {
		h.Set("Authorization", "Basic "+basicUser(user))
	}
}

// DataRequest sends a data-plane request to port inside sandbox id and
// returns its response when 2xx (the caller closes the body), else an
// *Error.
func (c *Client) DataRequest(ctx context.Context, method, id string, port int, token, user, pathAndQuery string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.Base+pathAndQuery, body)
	if err != nil {
		return nil, fmt.Errorf("building request: %w", err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("User-Agent", c.UserAgent)
	SetDataHeaders(req.Header, id, port, token, user)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, ReachError(c.Base, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, ErrorFromResponse(resp)
	}
	return resp, nil
}

func basicUser(user string) string { return base64.StdEncoding.EncodeToString([]byte(user + ":")) }
