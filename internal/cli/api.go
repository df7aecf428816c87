package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/api/apitypes"
)

const (
	// controlTimeout bounds one control-plane call (create may cold-start).
	controlTimeout = 2 * time.Minute
	// maxErrorBody is how much of an error response body is read.
	maxErrorBody = 64 << 10
	userAgent    = "cellfork-cli"
)

// apiError is an error answer from the daemon: a JSON body
// {"code":int,"message":str} (or plain text) and an X-Request-Id header.
type apiError struct {
	Status    int
	Message   string
	RequestID string
}

func (e *apiError) Error() string {
	if e.RequestID == "" {
		return e.Message
	}
	return fmt.Sprintf("%s (request %s)", e.Message, e.RequestID)
}

// parseAPIError builds an apiError from a non-2xx response's status, headers
// and (already read) body. The message is the JSON "message" if there is one,
// else the body text, else the HTTP status.
func parseAPIError(status int, h http.Header, body []byte) *apiError {
	e := &apiError{Status: status, RequestID: h.Get("X-Request-Id")}
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

func errorFromResponse(resp *http.Response) *apiError {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return parseAPIError(resp.StatusCode, resp.Header, body)
}

// apiClient calls the daemon's control plane. Safe for concurrent use.
type apiClient struct {
	base string // no trailing slash
	key  string
	http *http.Client
}

func (a *app) client() (*apiClient, error) {
	base := strings.TrimRight(a.g.url, "/")
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, &usageError{msg: fmt.Sprintf("invalid --url %q: want http(s)://host[:port]", a.g.url), usage: usageMain}
	}
	return &apiClient{base: base, key: a.g.apiKey, http: &http.Client{Transport: a.roundTripper()}}, nil
}

func (a *app) roundTripper() http.RoundTripper {
	if a.transport != nil {
		return a.transport
	}
	return http.DefaultTransport
}

// reachError rewords a transport failure for the user.
func reachError(base string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("cannot reach the daemon at %s: %w", base, err)
}

// do sends a control-plane request with a JSON body (if body != nil) and
// decodes a 2xx JSON answer into out (if out != nil). It returns the
// response headers, or an *apiError for non-2xx answers.
func (c *apiClient) do(ctx context.Context, method, path string, query url.Values, body, out any) (http.Header, error) {
	_, h, err := c.call(ctx, method, path, query, body, out)
	return h, err
}

// call is do that also returns the response's status code (0 if there was
// no response).
func (c *apiClient) call(ctx context.Context, method, path string, query url.Values, body, out any) (int, http.Header, error) {
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
	target := c.base + path
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
	if c.key != "" {
		req.Header.Set("X-API-KEY", c.key)
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, reachError(c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, resp.Header, errorFromResponse(resp)
	}
	if out == nil {
		return resp.StatusCode, resp.Header, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return resp.StatusCode, resp.Header, fmt.Errorf("decoding %s %s response: %w", method, path, err)
	}
	return resp.StatusCode, resp.Header, nil
}

// accessToken connects to sandbox id (resuming it if paused) and returns its
// data-plane access token, "" if the daemon issued none.
func (c *apiClient) accessToken(ctx context.Context, id string) (string, error) {
	var sb apitypes.Sandbox
	path := "/v2/sandboxes/" + url.PathEscape(id) + "/connect"
	if _, err := c.do(ctx, http.MethodPost, path, nil, apitypes.ConnectRequest{}, &sb); err != nil {
		return "", err
	}
	return sb.EnvdAccessToken, nil
}

// captureTransport remembers, for the last response, the X-Request-Id and
// (for a non-200 status) the error body, which connect-go drops for
// streaming calls ("HTTP status 502 Bad Gateway"). Safe for concurrent use.
type captureTransport struct {
	base http.RoundTripper

	mu        sync.Mutex
	requestID string
	err       *apiError
}

func (t *captureTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	var apiErr *apiError
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		apiErr = parseAPIError(resp.StatusCode, resp.Header, body)
	}
	t.mu.Lock()
	t.requestID = resp.Header.Get("X-Request-Id")
	t.err = apiErr
	t.mu.Unlock()
	return resp, nil
}

func (t *captureTransport) last() (requestID string, err *apiError) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.requestID, t.err
}
