package ids

import (
	"errors"
	"regexp"
	"testing"
)

// Ids round-trip their region and slot, look like E2B's ids and are DNS
// labels; every single-character change is caught.
func TestSandboxIDs(t *testing.T) {
	e2b := regexp.MustCompile(`^[a-z][a-z0-9]+$`)
	for _, tc := range []struct{ region, slot int }{{0, 0}, {1, 1}, {MaxRegions - 1, MaxSlots - 1}, {37, 12345}} {
		for range 200 {
			id := NewSandbox(tc.region, tc.slot)
			if !e2b.MatchString(id) || len(id) != Len {
				t.Fatalf("%q is not an E2B-shaped id", id)
			}
			got, err := ParseSandbox(id)
			if err != nil || got.Region != tc.region || got.Slot != tc.slot {
				t.Fatalf("ParseSandbox(%q) = %+v, %v; want %+v", id, got, err, tc)
			}
			for i := 0; i < Len; i++ {
				for _, c := range []byte(Alphabet) {
					if c == id[i] {
						continue
					}
					bad := id[:i] + string(c) + id[i+1:]
					if _, err := ParseSandbox(bad); err == nil {
						t.Fatalf("%q (one character off %q) was accepted", bad, id)
					}
				}
			}
		}
	}
}

func TestMalformedIDs(t *testing.T) {
	good := NewSandbox(3, 4)
	for _, tc := range []struct {
		id   string
		want error
	}{
		{"", ErrLength}, {good[:19], ErrLength}, {good + "x", ErrLength},
		{"c" + good[1:18] + "IL", ErrChar}, {"c" + good[1:19] + "u", ErrChar},
		{"x" + good[1:], ErrFormat},
		{"i5q0w8r3m2a7k1x9c4b6", ErrFormat}, // a single-host id
	} {
		if _, err := ParseSandbox(tc.id); !errors.Is(err, tc.want) {
			t.Errorf("ParseSandbox(%q) = %v, want %v", tc.id, err, tc.want)
		}
	}
}

func TestSnapshotIDs(t *testing.T) {
	id := NewSnapshot(77)
	if r, err := SnapshotRegion(id); err != nil || r != 77 || id[:4] != "snap" {
		t.Fatalf("SnapshotRegion(%q) = %d, %v", id, r, err)
	}
	if _, err := SnapshotRegion(id[:19] + string(Alphabet[(int(value[id[19]])+1)%32])); !errors.Is(err, ErrCheck) {
		t.Errorf("a bad check character: %v", err)
	}
}

// Tokens are derived, checked under every key, and rotate.
func TestTokens(t *testing.T) {
	k1, k2 := RandomKey(), RandomKey()
	old, _ := NewTokens(k1)
	tok := old.Token("c00001abcdefghjkmnp0")
	if len(tok) != 32 || !old.Check("c00001abcdefghjkmnp0", tok) {
		t.Fatal("a token does not check")
	}
	altered := tok[:31] + "0"
	if tok[31] == '0' { // altering to the same character alters nothing
		altered = tok[:31] + "1"
	}
	if old.Check("c00001abcdefghjkmnp1", tok) || old.Check("c00001abcdefghjkmnp0", altered) {
		t.Fatal("a token checked for another sandbox, or altered")
	}
	rotated, _ := NewTokens(k2, k1)
	if !rotated.Check("c00001abcdefghjkmnp0", tok) || rotated.Token("c00001abcdefghjkmnp0") == tok {
		t.Fatal("rotation: old tokens must still check, new ones come from the new key")
	}
	if _, err := NewTokens([]byte("short")); err == nil {
		t.Error("a short key was accepted")
	}
}

func BenchmarkRoute(b *testing.B) {
	id := NewSandbox(3, 1234)
	for b.Loop() {
		_, _ = ParseSandbox(id)
	}
}
