package chunkstore

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/zeebo/blake3"
)

// HashAlg names the hash of chunks and manifests (recorded in manifests).
// BLAKE3 was chosen over SHA-256 by a benchmark on a real image
// (docs/benchmarks.md, "Chunk store").
const HashAlg = "blake3-256"

// Hash is a chunk's or a manifest's BLAKE3-256 hash.
type Hash [32]byte

// Sum returns the hash of b.
func Sum(b []byte) Hash { return Hash(blake3.Sum256(b)) }

// String is the hash in lower-case hex, as object keys and roots spell it.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// IsZero reports whether h is the zero value (no hash).
func (h Hash) IsZero() bool { return h == Hash{} }

// ParseHash reads a hash written by String; anything else is
// ErrInvalidArgument.
func ParseHash(s string) (Hash, error) {
	var h Hash
	if len(s) != 2*len(h) {
		return h, errdefs.New(errdefs.ErrInvalidArgument, "hash %q: want %d hex digits", s, 2*len(h))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return h, errdefs.New(errdefs.ErrInvalidArgument, "hash %q: want lower-case hex digits", s)
		}
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return h, errdefs.New(errdefs.ErrInvalidArgument, "hash %q: %v", s, err)
	}
	return h, nil
}

// ChunkKey is the object key of the chunk h.
func ChunkKey(h Hash) string {
	s := h.String()
	return "chunks/" + s[:2] + "/" + s
}

// ManifestKey is the object key of the manifest root.
func ManifestKey(root Hash) string { return "manifests/" + root.String() }

// verify returns ErrCorrupt unless b hashes to want.
func verify(what string, want Hash, b []byte) error {
	if got := Sum(b); got != want {
		return fmt.Errorf("%s %s: read %d bytes that hash to %s: %w", what, want, len(b), got, errdefs.ErrCorrupt)
	}
	return nil
}

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	// Eight bytes at a time: a 32 KiB chunk of data is rejected at its
	// first non-zero word, a zero chunk costs one pass.
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// randomHex returns n random bytes in hex, for temporary names.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
