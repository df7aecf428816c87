package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"

	"github.com/cellfork/cellfork/internal/client"
)

// maxErrorBody is how much of an error response body is read.
const (
	maxErrorBody = 64 << 10
	userAgent    = "cellfork-cli"
)

// apiError is an error answer from the daemon (client.Error).
type apiError = client.Error

func parseAPIError(status int, h http.Header, body []byte) *apiError {
	return client.ParseError(status, h, body)
}

func errorFromResponse(resp *http.Response) *apiError { return client.ErrorFromResponse(resp) }

func reachError(base string, err error) error { return client.ReachError(base, err) }

// apiClient calls the daemon (internal/client). Safe for concurrent use.
type apiClient struct{ *client.Client }

func (a *app) client() (*apiClient, error) {
	c, err := client.New(a.g.url, a.g.apiKey, a.roundTripper())
	if err != nil {
		return nil, &usageError{msg: fmt.Sprintf("invalid --url %q: want http(s)://host[:port]", a.g.url), usage: usageMain}
	}
	c.UserAgent = userAgent
	return &apiClient{c}, nil
}

func (a *app) roundTripper() http.RoundTripper {
	if a.transport != nil {
		return a.transport
	}
	return http.DefaultTransport
}

// do sends a control-plane request (client.Client.Do).
func (c *apiClient) do(ctx context.Context, method, path string, query url.Values, body, out any) (http.Header, error) {
	return c.Do(ctx, method, path, query, body, out)
}

// call is do that also returns the status code (client.Client.Call).
func (c *apiClient) call(ctx context.Context, method, path string, query url.Values, body, out any) (int, http.Header, error) {
	return c.Call(ctx, method, path, query, body, out)
}

// accessToken connects to sandbox id (resuming it if paused) and returns its
// data-plane access token, "" if the daemon issued none.
func (c *apiClient) accessToken(ctx context.Context, id string) (string, error) {
	return c.AccessToken(ctx, id)
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
