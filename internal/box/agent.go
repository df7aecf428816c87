package box

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/timing"
)

// Agent is the daemon's client of the agent inside a box. Implementations
// must be safe for concurrent use.
type Agent interface {
	// WaitUp returns once the agent accepts connections.
	WaitUp(ctx context.Context, b *Box) error
	// Init sends POST /init.
	Init(ctx context.Context, b *Box, req envd.InitRequest) error
	// Health checks that the agent answers, over a kept-alive connection
	// that the box's next request then reuses.
	Health(ctx context.Context, b *Box) error
	// WaitReady returns once the default code context has started (and
	// imported its template's modules).
	WaitReady(ctx context.Context, b *Box) error
}

// HTTPAgent talks to the real agent over the box's transport.
type HTTPAgent struct{}

var _ Agent = HTTPAgent{}

// WaitUp polls the agent's port. A restored agent answers at once; a
// booting one within tens of milliseconds.
func (HTTPAgent) WaitUp(ctx context.Context, b *Box) error {
	defer timing.Since(ctx, "agent", time.Now())
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for delay := 500 * time.Microsecond; ; delay = min(2*delay, 20*time.Millisecond) {
		// A short per-attempt deadline: until gVisor owns the interface a
		// SYN can be dropped, and the kernel's retransmit takes a second.
		dctx, dcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		c, err := b.Net.Dial(dctx, envd.Port)
		dcancel()
		if err == nil {
			c.Close()
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("agent did not start: %w", err)
		}
		time.Sleep(delay)
	}
}

// Init posts the hand-off.
func (HTTPAgent) Init(ctx context.Context, b *Box, init envd.InitRequest) error {
	body, _ := json.Marshal(init)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://sandbox:%d/init", envd.Port), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	timing.Inject(ctx, req.Header)
	resp, err := b.Transport.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("posting /init: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errors.New("agent refused /init: " + resp.Status)
	}
	return nil
}

// Health gets /health.
func (HTTPAgent) Health(ctx context.Context, b *Box) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://sandbox:%d/health", envd.Port), nil)
	resp, err := b.Transport.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("the agent does not answer: %w", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil
}

// WaitReady gets the code interpreter's /ready, which answers once the
// default context is up.
func (HTTPAgent) WaitReady(ctx context.Context, b *Box) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://sandbox:%d/ready", envd.CodeInterpreterPort), nil)
	resp, err := b.Transport.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("waiting for the default code context: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("default code context failed to start: %s", resp.Status)
	}
	return nil
}
