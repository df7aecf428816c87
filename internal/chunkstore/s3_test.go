package chunkstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
)

func TestS3Backend(t *testing.T) {
	srv := chunkstoretest.StartS3(t)
	chunkstoretest.Run(t, func(t *testing.T) chunkstore.Backend {
		b, err := chunkstore.OpenS3(context.Background(), srv.NewBucket(t), "store/", srv.Config())
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// A holder that died leaves its lease object; once it is a lease old, the
// next locker removes it and gets the lock.
func TestS3StaleLeaseIsBroken(t *testing.T) {
	srv := chunkstoretest.StartS3(t)
	cfg := srv.Config() // leases of 3s
	b, err := chunkstore.OpenS3(context.Background(), srv.NewBucket(t), "", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Put(context.Background(), "locks/gc/x-dead", []byte("x")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, unlock, err := b.Lock(ctx, chunkstore.LockGC, true)
	if err != nil {
		t.Fatalf("lock behind a dead holder: %v", err)
	}
	defer unlock()
	if waited := time.Since(start); waited < 2*time.Second {
		t.Fatalf("got the lock after %v, before the dead holder's lease ran out", waited)
	}
	if found, _ := b.Has(context.Background(), []string{"locks/gc/x-dead"}); found[0] {
		t.Fatal("the stale lease object is still there")
	}
}
