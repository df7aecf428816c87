package chunkstore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
	"github.com/cellfork/cellfork/internal/errdefs"
)

// trap runs fire once, at the after-th call of Put (or Get).
type trap struct {
	chunkstore.Backend
	gets       bool
	after      int64
	n          atomic.Int64
	fire       func()
	afterFired atomic.Int64 // calls made after it fired
}

func (b *trap) count() {
	if n := b.n.Add(1); n == b.after {
		b.fire()
	} else if n > b.after {
		b.afterFired.Add(1)
	}
}

func (b *trap) Put(ctx context.Context, key string, data []byte) error {
	if !b.gets {
		b.count()
	}
	return b.Backend.Put(ctx, key, data)
}

func (b *trap) Get(ctx context.Context, key string) ([]byte, error) {
	if b.gets {
		b.count()
	}
	return b.Backend.Get(ctx, key)
}

func (b *trap) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if b.gets {
		b.count()
	}
	return b.Backend.(chunkstore.RangeReader).GetRange(ctx, key, off, n)
}

// packModes runs a fault test without packs and with packs small enough
// that the image is about a hundred of them (the store stops between
// them).
func packModes(t *testing.T, test func(t *testing.T, pack int)) {
	t.Run("Loose", func(t *testing.T) { test(t, -1) })
	t.Run("Packed", func(t *testing.T) { test(t, 64<<10) })
}

// bigImage has a few hundred chunks: enough to stop the store in the middle.
var bigImage = chunkstoretest.Image{Seed: 11, Pool: 12, Pages: 1500}

func s3Store(t *testing.T, srv *chunkstoretest.S3Server, bucket string, wrap func(chunkstore.Backend) chunkstore.Backend, retry chunkstore.Retry, cached bool, pack int) *chunkstore.Store {
	t.Helper()
	b, err := chunkstore.OpenS3(context.Background(), bucket, "p", srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	var bk chunkstore.Backend = b
	if wrap != nil {
		bk = wrap(b)
	}
	var cache *chunkstore.Cache
	if cached {
		if cache, err = chunkstore.OpenCache(t.TempDir(), 1<<30); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cache.Flush) // before its directory goes
	}
	s, err := chunkstore.New(bk, chunkstore.Options{Retry: retry, Cache: cache, PackBytes: pack})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkStored fails unless every chunk in the store hashes to its name,
// every chunk in the packs of its manifests is there and right, and there
// are want manifests.
func checkStored(t *testing.T, s *chunkstore.Store, want int) {
	t.Helper()
	ctx := context.Background()
	manifests := 0
	err := s.Backend().List(ctx, "", func(o chunkstore.Object) error {
		if filepath.Dir(o.Key) == "manifests" {
			manifests++
			root, err := chunkstore.ParseHash(filepath.Base(o.Key))
			if err != nil {
				return err
			}
			m, err := s.Manifest(ctx, root)
			if err != nil {
				return err
			}
			for _, p := range m.Packs {
				data, err := s.Backend().Get(ctx, chunkstore.PackKey(p.ID))
				if err != nil {
					return err
				}
				if int64(len(data)) != p.Bytes() {
					t.Errorf("pack %s: %d bytes, want %d", p.ID, len(data), p.Bytes())
					continue
				}
				for _, c := range p.Chunks {
					if chunkstore.Sum(data[:c.Size]) != c.Hash {
						t.Errorf("pack %s: chunk %s is corrupt", p.ID, c.Hash)
					}
					data = data[c.Size:]
				}
			}
			return nil
		}
		if filepath.Dir(o.Key) == "packs" {
			return nil // checked through the manifests
		}
		h, err := chunkstore.ParseHash(filepath.Base(o.Key))
		if err != nil {
			return nil // a lock object
		}
		data, err := s.Backend().Get(ctx, o.Key)
		if err != nil {
			return err
		}
		if chunkstore.Sum(data) != h {
			t.Errorf("chunk %s in the store is corrupt", o.Key)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if manifests != want {
		t.Fatalf("%d manifests in the store, want %d", manifests, want)
	}
}

// The store stops answering mid-upload and does not come back in time: a
// clear ErrUnavailable, no manifest, only whole chunks left; once it is
// back, the export finishes and uploads only what was missing.
func TestS3DownMidUpload(t *testing.T) { packModes(t, testS3DownMidUpload) }

func testS3DownMidUpload(t *testing.T, pack int) {
	srv := chunkstoretest.StartS3(t)
	bucket := srv.NewBucket(t)
	dir := t.TempDir()
	bigImage.Write(t, filepath.Join(dir, "img"))
	quick := chunkstore.Retry{Attempts: 3, Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	tr := &trap{after: 40, fire: srv.Stop}
	s := s3Store(t, srv, bucket, func(b chunkstore.Backend) chunkstore.Backend { tr.Backend = b; return tr }, quick, false, pack)
	st, err := s.Export(context.Background(), filepath.Join(dir, "img"), nil)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("export with the store down: %v (%s), want ErrUnavailable", err, &st)
	}
	t.Logf("export with the store down: %v", err)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	plain := s3Store(t, srv, bucket, nil, quick, false, pack)
	checkStored(t, plain, 0)
	again, err := plain.Export(context.Background(), filepath.Join(dir, "img"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Present < 20 || again.Present+again.Transferred != again.Distinct {
		t.Fatalf("export after the outage: %s; want the chunks uploaded before it found present", &again)
	}
	cold := s3Store(t, srv, bucket, nil, quick, true, pack)
	if _, err := cold.Import(context.Background(), again.Root, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, filepath.Join(dir, "img"), filepath.Join(dir, "out"))
	checkStored(t, plain, 1)
}

// The store goes away mid-upload and comes back: the retries carry the
// export through.
func TestS3OutageRetried(t *testing.T) { packModes(t, testS3OutageRetried) }

func testS3OutageRetried(t *testing.T, pack int) {
	srv := chunkstoretest.StartS3(t)
	bucket := srv.NewBucket(t)
	dir := t.TempDir()
	bigImage.Write(t, filepath.Join(dir, "img"))
	tr := &trap{after: 40, fire: func() {
		srv.Stop()
		go func() {
			time.Sleep(500 * time.Millisecond)
			if err := srv.Start(); err != nil {
				t.Error(err)
			}
		}()
	}}
	patient := chunkstore.Retry{Attempts: 30, Base: 100 * time.Millisecond, Max: time.Second}
	s := s3Store(t, srv, bucket, func(b chunkstore.Backend) chunkstore.Backend { tr.Backend = b; return tr }, patient, false, pack)
	st, err := s.Export(context.Background(), filepath.Join(dir, "img"), nil)
	if err != nil {
		t.Fatalf("export across a short outage: %v", err)
	}
	puts := st.Transferred // one a chunk, or one a pack
	if pack > 0 {
		puts = st.Packs
	}
	if pack > 0 && st.Packs < 80 {
		t.Fatalf("%d packs: too few to stop the store between them", st.Packs)
	}
	if tr.afterFired.Load() < int64(puts)-40 {
		t.Fatalf("the outage happened after the uploads (%d after, %s)", tr.afterFired.Load(), &st)
	}
	cold := s3Store(t, srv, bucket, nil, patient, true, pack)
	if _, err := cold.Import(context.Background(), st.Root, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	chunkstoretest.Equal(t, filepath.Join(dir, "img"), filepath.Join(dir, "out"))
	checkStored(t, cold, 1)
}

// The store stops answering mid-download: ErrUnavailable, no image
// directory and no leftovers; the chunks read before are in the cache, and
// once the store is back the import completes.
func TestS3DownMidDownload(t *testing.T) { packModes(t, testS3DownMidDownload) }

func testS3DownMidDownload(t *testing.T, pack int) {
	srv := chunkstoretest.StartS3(t)
	bucket := srv.NewBucket(t)
	dir := t.TempDir()
	bigImage.Write(t, filepath.Join(dir, "img"))
	quick := chunkstore.Retry{Attempts: 3, Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	st, err := s3Store(t, srv, bucket, nil, quick, false, pack).Export(context.Background(), filepath.Join(dir, "img"), nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := &trap{gets: true, after: 40, fire: srv.Stop}
	s := s3Store(t, srv, bucket, func(b chunkstore.Backend) chunkstore.Backend { tr.Backend = b; return tr }, quick, true, pack)
	ist, err := s.Import(context.Background(), st.Root, filepath.Join(dir, "out"))
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("import with the store down: %v (%s), want ErrUnavailable", err, &ist)
	}
	t.Logf("import with the store down: %v", err)
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("a failed import left %v", ents)
	}
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := chunkstore.OpenS3(short, bucket, "p", srv.Config()); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("opening a store that is down: %v, want ErrUnavailable", err)
	}
	// A daemon starting meanwhile opens it unchecked, and uses it once it
	// answers.
	cfg := srv.Config()
	cfg.NoCheck = true
	late, err := chunkstore.OpenS3(short, bucket, "p", cfg)
	if err != nil {
		t.Fatalf("opening a store that is down, unchecked: %v", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if ok, err := late.Has(context.Background(), []string{chunkstore.ManifestKey(st.Root)}); err != nil || !ok[0] {
		t.Fatalf("the store opened while it was down, once it answers: %v %v", ok, err)
	}
	ist, err = s.Import(context.Background(), st.Root, filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	if ist.Present < 20 {
		t.Fatalf("the chunks read before the outage were not cached: %s", &ist)
	}
	chunkstoretest.Equal(t, filepath.Join(dir, "img"), filepath.Join(dir, "out"))
}
