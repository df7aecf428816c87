// Package ids makes and reads the ids of a cluster's sandboxes and
// snapshots, and derives their access tokens. An id says where its sandbox
// lives, so a gateway routes a request by the id alone, with no lookup:
//
//	sandbox id, 20 characters of a lowercase base-32 alphabet:
//	  pos 0      'c'          the format
//	  pos 1-2    region       1024 regions
//	  pos 3-5    host slot    32768 hosts (a slot is never reused)
//	  pos 6-18   random       65 bits
//	  pos 19     check        a weighted sum of the others, mod 32
//	snapshot id: "snap" + region (2) + random (13) + check (1)
//
// The alphabet has no i, l, o or u, so ids read aloud or typed survive,
// and every id is also a valid E2B id ([a-z0-9], starting with a letter)
// and DNS label. The check character catches every single-character
// error and most transpositions before a request reaches a host.
package ids

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// Alphabet is the ids' base-32 alphabet.
const Alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// Limits of the fields.
const (
	MaxRegions = 1 << 10
	MaxSlots   = 1 << 15
	Len        = 20
)

var value [256]int8

func init() {
	for i := range value {
		value[i] = -1
	}
	for i, c := range []byte(Alphabet) {
		value[c] = int8(i)
	}
}

// Errors a malformed id gets.
var (
	ErrLength = errors.New("an id has 20 characters")
	ErrChar   = errors.New("an id has only the characters 0-9 and a-z without i, l, o, u")
	ErrFormat = errors.New("not a cluster id")
	ErrCheck  = errors.New("the id's check character does not match: mistyped?")
)

// Sandbox is a decoded sandbox id.
type Sandbox struct {
	Region int
	Slot   int
}

// check is the check character of s (without it): a sum with odd weights,
// which are invertible mod 32, so any one changed character changes it.
func check(s string) byte {
	sum := 0
	for i := 0; i < len(s); i++ {
		sum += (2*i + 1) * int(value[s[i]])
	}
	return Alphabet[sum%32]
}

func encode(dst []byte, v, n int) {
	for i := n - 1; i >= 0; i-- {
		dst[i] = Alphabet[v%32]
		v /= 32
	}
}

func decode(s string) int {
	v := 0
	for i := 0; i < len(s); i++ {
		v = v*32 + int(value[s[i]])
	}
	return v
}

func random(dst []byte) {
	b := make([]byte, len(dst))
	_, _ = rand.Read(b)
	for i := range dst {
		dst[i] = Alphabet[b[i]%32]
	}
}

// NewSandbox returns a fresh id of a sandbox on host slot in region.
func NewSandbox(region, slot int) string {
	if region < 0 || region >= MaxRegions || slot < 0 || slot >= MaxSlots {
		panic(fmt.Sprintf("ids: region %d or slot %d out of range", region, slot))
	}
	b := make([]byte, Len)
	b[0] = 'c'
	encode(b[1:3], region, 2)
	encode(b[3:6], slot, 3)
	random(b[6:19])
	b[19] = check(string(b[:19]))
	return string(b)
}

// NewSnapshot returns a fresh id of a snapshot taken in region.
func NewSnapshot(region int) string {
	b := make([]byte, Len)
	copy(b, "snap")
	encode(b[4:6], region, 2)
	random(b[6:19])
	b[19] = check(string(b[:19]))
	return string(b)
}

func valid(id string) error {
	if len(id) != Len {
		return ErrLength
	}
	for i := 0; i < len(id); i++ {
		if value[id[i]] < 0 {
			return ErrChar
		}
	}
	if check(id[:19]) != id[19] {
		return ErrCheck
	}
	return nil
}

// ParseSandbox decodes a sandbox id, or says what is wrong with it.
func ParseSandbox(id string) (Sandbox, error) {
	if len(id) == Len && id[0] != 'c' {
		return Sandbox{}, ErrFormat
	}
	if err := valid(id); err != nil {
		return Sandbox{}, err
	}
	return Sandbox{Region: decode(id[1:3]), Slot: decode(id[3:6])}, nil
}

// SnapshotRegion decodes a snapshot id's region.
func SnapshotRegion(id string) (int, error) {
	if len(id) == Len && id[:4] != "snap" {
		return 0, ErrFormat
	}
	if err := valid(id); err != nil {
		return 0, err
	}
	return decode(id[4:6]), nil
}

// Tokens derives sandboxes' access tokens from a key, so that any gateway
// or host holding the key checks a token with no lookup. Keys rotate: the
// first derives new tokens, all are accepted. Tokens cannot be revoked one
// by one (as E2B's are not); killing the sandbox ends its token's use.
type Tokens struct {
	keys [][]byte
}

// NewTokens returns a deriver over keys (newest first, at least one).
func NewTokens(keys ...[]byte) (*Tokens, error) {
	if len(keys) == 0 {
		return nil, errors.New("ids: no token key")
	}
	for _, k := range keys {
		if len(k) < 32 {
			return nil, errors.New("ids: a token key has at least 32 bytes")
		}
	}
	return &Tokens{keys: keys}, nil
}

func derive(key []byte, id string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("cellfork/sbx-token/v1\x00"))
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil))[:32]
}

// Token returns sandbox id's access token (32 hex digits, as E2B's).
func (t *Tokens) Token(id string) string { return derive(t.keys[0], id) }

// Check reports whether token is sandbox id's, under any key.
func (t *Tokens) Check(id, token string) bool {
	ok := false
	for _, k := range t.keys {
		ok = hmac.Equal([]byte(derive(k, id)), []byte(token)) || ok
	}
	return ok
}

// RandomKey returns a fresh 32-byte key.
func RandomKey() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return b
}
