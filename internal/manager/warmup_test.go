package manager

import "testing"

// A warm image the daemon builds is restored once, before the pool
// restores it, for its first request (warmup.go), and that sandbox is gone
// afterwards; an image already built is not warmed up again. (The fake
// machine has no data plane, so the run_code fails: the warm-up is best
// effort and Start goes on.)
func TestNewWarmImageIsWarmedUpOnce(t *testing.T) {
	e := newEnv(t, nil) // no pool: the only restores are the warm-up's
	if n := e.h.Restores(); n != 1 {
		t.Fatalf("building the warm image restored it %d times, want 1 (the warm-up)", n)
	}
	if leaks := e.h.Leaks(); len(leaks) > 0 {
		t.Errorf("the warm-up left %v", leaks)
	}
	e.restart()
	if n := e.h.Restores(); n != 1 {
		t.Errorf("a restart with the warm image built restored it again (%d restores)", n)
	}
}
