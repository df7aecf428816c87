package agent

import (
	"net/http"
	"net/http/httptest"
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
