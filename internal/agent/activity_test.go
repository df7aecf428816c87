package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestAfterQuietWaitsForRequests: fn runs once no request has been in
// flight for quiet: not while one runs, not right after it ends.
func TestAfterQuietWaitsForRequests(t *testing.T) {
	a := NewActivity()
	release, started := make(chan struct{}), make(chan struct{})
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
	}))
	done := make(chan struct{})
	go func() { h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/execute", nil)); close(done) }()
	<-started
	ran := make(chan time.Time, 1)
	a.AfterQuiet(30*time.Millisecond, 10*time.Second, func() { ran <- time.Now() })
	select {
	case <-ran:
		t.Fatal("ran while a request was in flight")
	case <-time.After(150 * time.Millisecond):
	}
	close(release)
	<-done
	ended := time.Now()
	select {
	case at := <-ran:
		if d := at.Sub(ended); d < 30*time.Millisecond {
			t.Errorf("ran %v after the request ended, want >= 30ms", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("never ran after the requests ended")
	}
}

// TestAfterQuietMax: a request that never ends delays fn by max at most;
// with nothing in flight fn runs after quiet.
func TestAfterQuietMax(t *testing.T) {
	a := NewActivity()
	block := make(chan struct{})
	defer close(block)
	started := make(chan struct{})
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { close(started); <-block }))
	go h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/stream", nil))
	<-started
	t0 := time.Now()
	ran := make(chan time.Duration, 1)
	a.AfterQuiet(20*time.Millisecond, 200*time.Millisecond, func() { ran <- time.Since(t0) })
	select {
	case d := <-ran:
		if d < 200*time.Millisecond {
			t.Errorf("ran after %v with a request in flight, want the max (200ms)", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("never ran")
	}

	quiet := NewActivity()
	t0 = time.Now()
	quiet.AfterQuiet(20*time.Millisecond, 10*time.Second, func() { ran <- time.Since(t0) })
	select {
	case d := <-ran:
		if d < 20*time.Millisecond || d > 2*time.Second {
			t.Errorf("ran after %v with nothing in flight, want about 20ms", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("never ran")
	}
}

// TestLaterHoldsTheNextRequests: the request that starts work with Later
// answers without it; the requests after it start once it is done, in the
// order the work was started.
func TestLaterHoldsTheNextRequests(t *testing.T) {
	a := NewActivity()
	release := make(chan struct{})
	var order []string
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/init":
			a.Later(func() { <-release; order = append(order, "first") })
			a.Later(func() { order = append(order, "second") })
		default:
			order = append(order, "request")
		}
	}))
	answered := make(chan struct{})
	go func() {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/init", nil))
		close(answered)
	}()
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		t.Fatal("/init waited for the work it started")
	}
	served := make(chan struct{})
	go func() { h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/files", nil)); close(served) }()
	select {
	case <-served:
		t.Fatal("the next request was served before the work was done")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Fatal("the next request never started")
	}
	if got := strings.Join(order, ","); got != "first,second,request" {
		t.Errorf("order %q, want first,second,request", got)
	}
}

// TestLaterGivesUpWithTheClient: a request held behind Later ends when
// its client goes away.
func TestLaterGivesUpWithTheClient(t *testing.T) {
	a := NewActivity()
	block := make(chan struct{})
	defer close(block)
	a.Later(func() { <-block })
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("served while the work runs") }))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/health", nil).WithContext(ctx))
		close(done)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the request stayed after its client left")
	}
}
