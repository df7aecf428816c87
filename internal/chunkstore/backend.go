package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Backend is where objects live: a directory (file://) or an S3 bucket
// (s3://). Keys are slash-separated (chunks/ab/ab12..., manifests/...).
// Implementations are safe for concurrent use and classify their errors:
// errdefs.ErrNotFound for an absent object, errdefs.ErrUnavailable for a
// store that does not answer (worth a retry), anything else as is.
// chunkstoretest.Run is their conformance suite.
type Backend interface {
	// Get returns the object's bytes.
	Get(ctx context.Context, key string) ([]byte, error)
	// Put stores data under key, replacing what was there. Readers see the
	// old object, the new one or none, never a part of one.
	Put(ctx context.Context, key string, data []byte) error
	// Has reports, for each key, whether the object exists.
	Has(ctx context.Context, keys []string) ([]bool, error)
	// Delete removes the object; an absent one is not an error.
	Delete(ctx context.Context, key string) error
	// List calls fn with every object whose key starts with prefix, in no
	// particular order, and stops at fn's first error.
	List(ctx context.Context, prefix string, fn func(Object) error) error
	// Flush makes every Put that returned durable (a no-op where Put is).
	Flush(ctx context.Context) error
	Locker
	// String names the store for messages (no credentials).
	String() string
}

// RangeReader is a Backend that can read part of an object: n bytes from
// off, fewer if the object ends first (the caller checks the length).
// Pack files (pack.go) are read this way; a Backend without it is read
// whole and cut.
type RangeReader interface {
	GetRange(ctx context.Context, key string, off, n int64) ([]byte, error)
}

// getRange reads n bytes of key from off, by b's GetRange if it has one.
func getRange(ctx context.Context, b Backend, key string, off, n int64) ([]byte, error) {
	if rr, ok := b.(RangeReader); ok {
		return rr.GetRange(ctx, key, off, n)
	}
	data, err := b.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	if off >= int64(len(data)) {
		return nil, nil
	}
	return data[off:min(off+n, int64(len(data)))], nil
}

// Object is one listed object.
type Object struct {
	Key      string
	Size     int64
	Modified time.Time
}

// Locker holds a store's named locks: LockStore, which Export holds shared
// from its existence check to its manifest and GC exclusively while it
// sweeps, and LockGC, which a collector holds exclusively (one at a time).
// The file backend uses flock(2), the S3 backend lease objects; the
// cluster may supply its own (PostgreSQL advisory locks) through
// Options.Locker.
type Locker interface {
	// Lock waits until it holds the lock (shared, or exclusive) or ctx is
	// done. The returned context is ctx, cancelled if the lock is lost (a
	// lease that could not be renewed); unlock releases the lock and
	// cancels it.
	Lock(ctx context.Context, name string, exclusive bool) (held context.Context, unlock func(), err error)
}

// The lock names.
const (
	LockStore = "store"
	LockGC    = "gc"
)

func isNotFound(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }

// Retry is how operations on a backend are retried when it does not answer
// (errdefs.ErrUnavailable): up to Attempts tries, waiting a random time up
// to Base, 2*Base, 4*Base... (at most Max) between them.
type Retry struct {
	Attempts int
	Base     time.Duration
	Max      time.Duration
}

// DefaultRetry gives a store about ten seconds to come back.
var DefaultRetry = Retry{Attempts: 8, Base: 100 * time.Millisecond, Max: 3 * time.Second}

// do runs op until it succeeds, fails with another class than
// ErrUnavailable, runs out of attempts or ctx is done.
func (r Retry) do(ctx context.Context, op func() error) error {
	attempts := max(r.Attempts, 1)
	for i := 0; ; i++ {
		err := op()
		if err == nil || !errors.Is(err, errdefs.ErrUnavailable) || i+1 >= attempts {
			if err != nil && i > 0 {
				err = fmt.Errorf("after %d attempts: %w", i+1, err)
			}
			return err
		}
		wait := min(r.Base<<i, r.Max)
		if wait > 0 {
			wait = time.Duration(rand.Int64N(int64(wait)) + 1)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (retrying after: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// IntoReader is a Backend that reads a whole object into the caller's
// buffer, which must be the object's size (one of another size is
// ErrCorrupt): the file backend's, so that an import from a local store
// allocates nothing per chunk. A Backend without it is read whole and
// copied.
type IntoReader interface {
	GetInto(ctx context.Context, key string, dst []byte) error
}

// getInto reads key whole into dst, by b's GetInto if it has one.
func getInto(ctx context.Context, b Backend, key string, dst []byte) error {
	if ir, ok := b.(IntoReader); ok {
		return ir.GetInto(ctx, key, dst)
	}
	data, err := b.Get(ctx, key)
	if err != nil {
		return err
	}
	if len(data) != len(dst) {
		return fmt.Errorf("%s: %d bytes, want %d: %w", key, len(data), len(dst), errdefs.ErrCorrupt)
	}
	copy(dst, data)
	return nil
}

// retrying wraps a Backend so that each call is retried by r.
type retrying struct {
	Backend
	r Retry
}

func (b retrying) Get(ctx context.Context, key string) (data []byte, err error) {
	err = b.r.do(ctx, func() error { data, err = b.Backend.Get(ctx, key); return err })
	return data, err
}

func (b retrying) GetRange(ctx context.Context, key string, off, n int64) (data []byte, err error) {
	err = b.r.do(ctx, func() error { data, err = getRange(ctx, b.Backend, key, off, n); return err })
	return data, err
}

func (b retrying) GetInto(ctx context.Context, key string, dst []byte) error {
	return b.r.do(ctx, func() error { return getInto(ctx, b.Backend, key, dst) })
}

func (b retrying) Put(ctx context.Context, key string, data []byte) error {
	return b.r.do(ctx, func() error { return b.Backend.Put(ctx, key, data) })
}

func (b retrying) Has(ctx context.Context, keys []string) (found []bool, err error) {
	err = b.r.do(ctx, func() error { found, err = b.Backend.Has(ctx, keys); return err })
	return found, err
}

func (b retrying) Delete(ctx context.Context, key string) error {
	return b.r.do(ctx, func() error { return b.Backend.Delete(ctx, key) })
}

func (b retrying) Flush(ctx context.Context) error {
	return b.r.do(ctx, func() error { return b.Backend.Flush(ctx) })
}

// List is retried whole: fn may see an object twice.
func (b retrying) List(ctx context.Context, prefix string, fn func(Object) error) error {
	return b.r.do(ctx, func() error { return b.Backend.List(ctx, prefix, fn) })
}
