package failpoint

import (
	"errors"
	"sync"
	"testing"
)

var errTest = errors.New("test failure")

// An armed name fails until disabled; other names and a disabled one
// pass; Enable again replaces the failure, and one disable undoes it.
func TestEnable(t *testing.T) {
	if err := Inject(Restore); err != nil {
		t.Fatalf("nothing armed: %v", err)
	}
	disable := Enable(Restore, func() error { return errTest })
	if err := Inject(Restore); !errors.Is(err, errTest) {
		t.Errorf("armed: %v", err)
	}
	if err := Inject(Checkpoint); err != nil {
		t.Errorf("another name: %v", err)
	}
	other := errors.New("other")
	disableAgain := Enable(Restore, func() error { return other })
	if err := Inject(Restore); !errors.Is(err, other) {
		t.Errorf("armed again: %v", err)
	}
	disable()
	disableAgain() // once disabled, a second disable does nothing
	if err := Inject(Restore); err != nil {
		t.Errorf("disabled: %v", err)
	}
	if n := armed.Load(); n != 0 {
		t.Errorf("%d names counted as armed after every disable", n)
	}
}

// After lets n calls pass, then fails every later one, counting calls
// from every goroutine.
func TestAfter(t *testing.T) {
	defer Enable(Init, After(2, errTest))()
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Go(func() { errs <- Inject(Init) })
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if errors.Is(err, errTest) {
			failed++
		} else if err != nil {
			t.Errorf("unexpected %v", err)
		}
	}
	if failed != 8 {
		t.Errorf("%d of 10 calls failed, want 8", failed)
	}
}
