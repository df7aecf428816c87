package sandbox

import (
	"crypto/rand"
	"encoding/hex"
)

// NewID returns a 20-character lowercase alphanumeric sandbox id starting
// with a letter, like E2B's.
func NewID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	b[0] = alphabet[int(b[0])%26] // start with a letter
	return string(b)
}

// RandomHex returns n random bytes in hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
