package pool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
)

func TestAdmissionQueuesInOrderThenRefuses(t *testing.T) {
	a := NewAdmission(1, 2, time.Second, nil)
	release, err := a.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.TryAcquire(false); ok {
		t.Fatal("background work took the only slot")
	}
	order := make(chan int, 2)
	for i := range 2 {
		go func() {
			r, err := a.Acquire(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			time.Sleep(10 * time.Millisecond)
			r()
		}()
		time.Sleep(20 * time.Millisecond) // arrive in order
	}
	if _, err := a.Acquire(context.Background()); !errors.Is(err, errdefs.ErrUnavailable) || errdefs.UserMessage(err) == "" {
		t.Fatalf("third waiter: %v", err)
	}
	if _, ok := a.TryAcquire(false); ok {
		t.Fatal("background work jumped the queue")
	}
	release()
	if first, second := <-order, <-order; first != 0 || second != 1 {
		t.Fatalf("served %d then %d", first, second)
	}
	for deadline := time.Now().Add(time.Second); !a.Idle() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // the waiters hold their slot 10 ms
	}
	if r, ok := a.TryAcquire(false); !ok {
		t.Fatal("idle gate refused background work")
	} else {
		r()
	}
}

func TestAdmissionWaitBound(t *testing.T) {
	a := NewAdmission(1, 4, 50*time.Millisecond, nil)
	release, _ := a.Acquire(context.Background())
	defer release()
	start := time.Now()
	_, err := a.Acquire(context.Background())
	if !errors.Is(err, errdefs.ErrUnavailable) || time.Since(start) > time.Second {
		t.Fatalf("waited %v: %v", time.Since(start), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
}

func TestAdmissionRefillWaitsForRequests(t *testing.T) {
	idle := make(chan struct{}, 2)
	a := NewAdmission(4, 4, time.Second, func() { idle <- struct{}{} })
	release, err := a.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.TryAcquire(false); ok {
		t.Fatal("a refill shared the CPUs with a running request although slots were free")
	}
	release()
	select {
	case <-idle:
	default:
		t.Fatal("the pool was not told at once that the last request finished")
	}
	if _, ok := a.TryAcquire(true); ok {
		t.Fatal("a standby fill started while the client's next request may still come")
	}
	r, ok := a.TryAcquire(false)
	if !ok {
		t.Fatal("no request runs, yet the refill was refused")
	}
	r()
	select {
	case <-idle:
	case <-time.After(time.Second):
		t.Fatal("the pool was not told again once the grace ended")
	}
	if r, ok := a.TryAcquire(true); !ok {
		t.Fatal("the grace ended, yet the standby fill was refused")
	} else {
		r()
	}
	select {
	case <-idle:
		t.Fatal("background work's release counted as a request's")
	case <-time.After(2 * IdleGrace):
	}
}
