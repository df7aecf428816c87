package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Lock takes a lease lock made of objects, locks/<name>/<s|x>-<id>, one per
// holder or waiter, renewed every third of cfg.LockLease. An object not
// renewed for a lease (by the server's clock, as its listing dates it) is
// stale: its holder died, and it is removed. A shared locker backs off
// while any exclusive object exists; an exclusive locker waits for the
// shared ones to go (keeping its object, so new shared lockers back off and
// it is not starved) and backs off from another exclusive one, both with
// jittered waits. The held context is cancelled when the lease could not be
// renewed in time.
func (b *S3Backend) Lock(ctx context.Context, name string, exclusive bool) (context.Context, func(), error) {
	if name == "" || strings.ContainsAny(name, "/\\\x00") {
		return nil, nil, errdefs.New(errdefs.ErrInvalidArgument, "lock name %q", name)
	}
	kind := "s"
	if exclusive {
		kind = "x"
	}
	dir := "locks/" + name + "/"
	mine := dir + kind + "-" + randomHex(8)
	lease := b.cfg.LockLease
	put := func() error { return DefaultRetry.do(ctx, func() error { return b.Put(ctx, mine, []byte(kind)) }) }
	drop := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.Timeout)
		defer cancel()
		_ = b.Delete(dctx, mine)
	}
	backoff := func(i int) error {
		t := time.NewTimer(time.Duration(rand.Int64N(int64(min(50*time.Millisecond<<min(i, 5), time.Second)))) + 10*time.Millisecond)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for lock %s of %s: %w", name, b, ctx.Err())
		case <-t.C:
			return nil
		}
	}
	renewed := time.Now()
	if err := put(); err != nil {
		return nil, nil, err
	}
	for i := 0; ; i++ {
		if time.Since(renewed) > lease/3 {
			if err := put(); err != nil {
				drop()
				return nil, nil, err
			}
			renewed = time.Now()
		}
		others, err := b.lockHolders(ctx, dir, mine, lease)
		if err != nil {
			drop()
			return nil, nil, err
		}
		conflict, wait := false, false
		for _, o := range others {
			x := strings.HasPrefix(o, dir+"x-")
			switch {
			case x:
				conflict = true // another exclusive: back off, both of us
			case exclusive:
				wait = true // a shared holder: wait for it to go
			}
		}
		if !conflict && !wait {
			break
		}
		if conflict {
			drop()
		}
		if err := backoff(i); err != nil {
			if !conflict {
				drop()
			}
			return nil, nil, err
		}
		if conflict {
			if err := put(); err != nil {
				return nil, nil, err
			}
			renewed = time.Now()
		}
	}

	held, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(lease / 3)
		defer t.Stop()
		last := renewed
		for {
			select {
			case <-stop:
				return
			case <-held.Done():
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(held, lease/3)
			err := b.Put(rctx, mine, []byte(kind))
			rcancel()
			if err == nil {
				last = time.Now()
			} else if time.Since(last) > 2*lease/3 {
				cancel(fmt.Errorf("lock %s of %s: lease not renewed: %v: %w", name, b, err, errdefs.ErrUnavailable))
				return
			}
		}
	}()
	var once sync.Once
	unlock := func() {
		once.Do(func() {
			close(stop)
			wg.Wait()
			cancel(errors.New("unlocked"))
			drop()
		})
	}
	return held, unlock, nil
}

// lockHolders lists the live lock objects under dir other than mine,
// removing stale ones. The server's date of mine is "now".
func (b *S3Backend) lockHolders(ctx context.Context, dir, mine string, lease time.Duration) ([]string, error) {
	var objs []Object
	var now time.Time
	err := DefaultRetry.do(ctx, func() error {
		objs, now = objs[:0], time.Time{}
		return b.List(ctx, dir, func(o Object) error {
			if o.Key == mine {
				now = o.Modified
			} else {
				objs = append(objs, o)
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	if now.IsZero() {
		// Ours vanished: another locker took it for stale.
		if err := DefaultRetry.do(ctx, func() error { return b.Put(ctx, mine, []byte("renew")) }); err != nil {
			return nil, err
		}
		now = time.Now()
	}
	var live []string
	for _, o := range objs {
		if now.Sub(o.Modified) > lease {
			_ = b.Delete(ctx, o.Key)
			continue
		}
		live = append(live, o.Key)
	}
	return live, nil
}
