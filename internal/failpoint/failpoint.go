// Package failpoint lets tests make a named step fail (containerd's
// failpoints): code calls Inject at a step that can fail in production, and
// a test arms that name with Enable. With nothing armed, Inject costs one
// atomic load.
package failpoint

import (
	"sync"
	"sync/atomic"
)

// Names of the failpoints the daemon has.
const (
	Netns      = "netns"      // creating a box's network
	Restore    = "restore"    // restoring a checkpoint into a box
	Checkpoint = "checkpoint" // writing a checkpoint
	Init       = "init"       // the hand-off's POST /init to the agent
	StorePut   = "store.put"  // writing a sandbox record
	Resume     = "resume"     // thawing a frozen box
)

var (
	armed atomic.Int32
	mu    sync.Mutex
	errs  = map[string]func() error{}
)

// Inject returns the error armed at name, or nil.
func Inject(name string) error {
	if armed.Load() == 0 {
		return nil
	}
	mu.Lock()
	f := errs[name]
	mu.Unlock()
	if f == nil {
		return nil
	}
	return f()
}

// Enable makes Inject(name) return what f returns (nil: no failure this
// time) until the returned func is called.
func Enable(name string, f func() error) (disable func()) {
	mu.Lock()
	if _, ok := errs[name]; !ok {
		armed.Add(1)
	}
	errs[name] = f
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := errs[name]; ok {
			delete(errs, name)
			armed.Add(-1)
		}
	}
}

// After returns a func for Enable that lets n calls pass, then fails every
// later one with err.
func After(n int, err error) func() error {
	var calls atomic.Int32
	return func() error {
		if int(calls.Add(1)) > n {
			return err
		}
		return nil
	}
}
