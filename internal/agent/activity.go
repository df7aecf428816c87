package agent

import (
	"net/http"
	"sync"
	"time"
)

// Activity counts the requests the agent is serving, so that work that can
// wait (the default user's spare shell after /init) runs once they have
// gone quiet instead of beside a sandbox's first requests; and it holds
// requests back until work that a request's answer did not wait for is
// done (Later). Safe for concurrent use.
type Activity struct {
	mu       sync.Mutex
	inFlight int       // guarded by mu
	lastEnd  time.Time // guarded by mu: when the last request ended
	// later is closed once the work the last Later started is done; nil:
	// none was started. Guarded by mu.
	later chan struct{}
}

// NewActivity returns an Activity with nothing in flight.
func NewActivity() *Activity { return &Activity{lastEnd: time.Now()} }

// Wrap counts h's requests, from their start until their handler returns
// (a stream counts until it ends), and starts each once the work Later
// started before it is done.
func (a *Activity) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.inFlight++
		later := a.later
		a.mu.Unlock()
		defer func() {
			a.mu.Lock()
			a.inFlight--
			a.lastEnd = time.Now()
			a.mu.Unlock()
		}()
		if later != nil {
			select {
			case <-later:
			case <-r.Context().Done():
				return // the client is gone
			}
		}
		h.ServeHTTP(w, r)
	})
}

// Later calls fn in its own goroutine, after the work of earlier calls,
// and holds the requests that Wrap starts from now on until it has
// returned: for work that the request which asks for it need not wait
// for, but that every later request must find done (the identity files
// of /init).
func (a *Activity) Later(fn func()) {
	done := make(chan struct{})
	a.mu.Lock()
	prev := a.later
	a.later = done
	a.mu.Unlock()
	go func() {
		defer close(done)
		if prev != nil {
			<-prev
		}
		fn()
	}()
}

// AfterQuiet calls fn, in its own goroutine, once no request has been in
// flight for quiet, or once max has passed, whichever comes first.
func (a *Activity) AfterQuiet(quiet, max time.Duration, fn func()) {
	deadline := time.Now().Add(max)
	var check func()
	check = func() {
		now := time.Now()
		a.mu.Lock()
		wait := quiet
		if a.inFlight == 0 {
			wait = quiet - now.Sub(a.lastEnd)
		}
		a.mu.Unlock()
		if left := deadline.Sub(now); wait <= 0 || left <= 0 {
			fn()
			return
		} else if wait > left {
			wait = left
		}
		time.AfterFunc(wait, check)
	}
	time.AfterFunc(quiet, check)
}
