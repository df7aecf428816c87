package chunkstore

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"

	"github.com/zeebo/blake3"
)

// benchImage is a real image file to hash: $CHUNKSTORE_BENCH_IMAGE, else
// the largest warm pages.img under the default template directory.
func benchImage(b *testing.B) []byte {
	p := os.Getenv("CHUNKSTORE_BENCH_IMAGE")
	if p == "" {
		matches, _ := filepath.Glob("/var/lib/cellfork/templates/*/*/warm-*/pages.img")
		if len(matches) == 0 {
			b.Skip("no image: set CHUNKSTORE_BENCH_IMAGE to a file of 50+ MB")
		}
		p = matches[0]
	}
	data, err := os.ReadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkHash hashes a real image in chunks of the default average size,
// as Export does: the choice of BLAKE3 over SHA-256 (SHA-NI) rests on it.
//
//	go test -run XXX -bench Hash -benchtime 20x ./internal/chunkstore/
func BenchmarkHash(b *testing.B) {
	img := benchImage(b)
	for _, alg := range []struct {
		name string
		sum  func([]byte)
	}{
		{"blake3", func(p []byte) { blake3.Sum256(p) }},
		{"sha256", func(p []byte) { sha256.Sum256(p) }},
	} {
		for _, cs := range []int{32 << 10, 64 << 10} {
			b.Run(alg.name+"/"+map[int]string{32 << 10: "32KiB", 64 << 10: "64KiB"}[cs], func(b *testing.B) {
				b.SetBytes(int64(len(img)))
				for b.Loop() {
					for off := 0; off < len(img); off += cs {
						alg.sum(img[off:min(off+cs, len(img))])
					}
				}
			})
		}
	}
}
