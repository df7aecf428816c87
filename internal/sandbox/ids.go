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

// IDs mints sandbox and snapshot ids and sandbox access tokens. One host
// mints random ones (RandomIDs); a cluster host mints ids that say where
// the sandbox lives, and derives tokens any gateway can check
// (internal/ids).
type IDs interface {
	SandboxID() string
	SnapshotID() string
	Token(sandboxID string) string
	// Own reports whether id was minted here, so a create may ask for it
	// (the gateway that placed the sandbox minted it).
	Own(sandboxID string) bool
}

// RandomIDs are a single host's ids and tokens.
type RandomIDs struct{}

// SandboxID returns a random E2B-like id.
func (RandomIDs) SandboxID() string { return NewID() }

// SnapshotID returns a random snapshot id.
func (RandomIDs) SnapshotID() string { return "snap" + NewID()[:16] }

// Token returns a random token.
func (RandomIDs) Token(string) string { return RandomHex(16) }

// Own is false: a single host takes no ids from outside.
func (RandomIDs) Own(string) bool { return false }
