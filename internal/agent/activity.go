package agent

import (
	"net/http"
	"sync"
	"time"
)

// Activity counts the requests the agent is serving, so that work that can
// wait (the default user's spare shell after /init) runs once they have
// gone quiet instead of beside a sandbox's first requests. Safe for
// concurrent use.
type Activity struct {
	mu       sync.Mutex
	inFlight int       // guarded by mu
	lastEnd  time.Time // guarded by mu: when the last request ended
}

// NewActivity returns an Activity with nothing in flight.
func NewActivity() *Activity { return &Activity{lastEnd: time.Now()} }

// Wrap counts h's requests, from their start until their handler returns
// (a stream counts until it ends).
func (a *Activity) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.inFlight++
		a.mu.Unlock()
		defer func() {
			a.mu.Lock()
			a.inFlight--
			a.lastEnd = time.Now()
			a.mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
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
