package chunkstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
)

// BenchmarkImportFromCache imports an image whose chunks are all in the
// host cache: $CHUNKSTORE_BENCH_DIR (an image directory, e.g. a spilled
// sandbox's), else a synthetic 64 MB one.
//
//	CHUNKSTORE_BENCH_DIR=/path/to/image go test -run XXX -bench ImportFromCache ./internal/chunkstore/
func BenchmarkImportFromCache(b *testing.B) {
	tmp := b.TempDir()
	img := os.Getenv("CHUNKSTORE_BENCH_DIR")
	if img == "" {
		img = filepath.Join(tmp, "img")
		chunkstoretest.Image{Seed: 1, Pool: 2, Pages: 16000}.Write(b, img)
	}
	store, err := chunkstore.OpenFile(filepath.Join(tmp, "store"))
	if err != nil {
		b.Fatal(err)
	}
	cache, err := chunkstore.OpenCache(filepath.Join(tmp, "cache"), 1<<30)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cache.Flush)
	s, err := chunkstore.New(store, chunkstore.Options{Cache: cache})
	if err != nil {
		b.Fatal(err)
	}
	st, err := s.Export(context.Background(), img, nil)
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	for _, par := range []int{2, 4, 16, -1} {
		name := fmt.Sprint("parallel-", par)
		if par < 0 {
			name = "linked" // whole files hard-linked from the cache
		}
		b.Run(name, func(b *testing.B) {
			s, err := chunkstore.New(store, chunkstore.Options{Cache: cache, Parallel: max(par, 16), LinkFiles: par < 0})
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(st.Bytes)
			for b.Loop() {
				out := filepath.Join(tmp, fmt.Sprint("out", i))
				i++
				ist, err := s.Import(context.Background(), st.Root, out)
				if err != nil {
					b.Fatal(err)
				}
				if ist.Transferred != 0 {
					b.Fatalf("fetched from the store: %s", &ist)
				}
				b.StopTimer()
				os.RemoveAll(out)
				b.StartTimer()
			}
		})
	}
}
