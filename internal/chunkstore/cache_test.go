package chunkstore

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	dir := t.TempDir()
	c, err := OpenCache(dir, 3000)
	if err != nil {
		t.Fatal(err)
	}
	obj := func(i byte) []byte { return bytes.Repeat([]byte{i}, 1000) }
	key := func(i byte) string { return ChunkKey(Sum(obj(i))) }
	c.put(key(1), obj(1))
	c.put(key(2), obj(2))
	c.put(key(3), obj(3))
	if _, ok := c.read(key(1), nil); !ok { // 1 is now the most recent
		t.Fatal("miss")
	}
	c.put(key(4), obj(4)) // evicts 2
	if c.has(key(2)) || !c.has(key(1)) || !c.has(key(3)) || !c.has(key(4)) {
		t.Fatalf("wrong eviction: %+v", c.Stats())
	}
	if _, err := os.Stat(filepath.Join(dir, key(2))); !os.IsNotExist(err) {
		t.Fatal("the evicted file is still there")
	}
	if st := c.Stats(); st.Objects != 3 || st.Bytes != 3000 {
		t.Fatalf("stats %+v", st)
	}
	// A crash mid-put leaves a temporary file; reopening drops it, finds
	// what is there, oldest first out, and applies a smaller budget.
	os.WriteFile(filepath.Join(dir, "tmp", "half"), []byte("x"), 0o600)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(dir, key(3)), old, old)
	c2, err := OpenCache(dir, 2000)
	if err != nil {
		t.Fatal(err)
	}
	if st := c2.Stats(); st.Objects != 2 || c2.has(key(3)) {
		t.Fatalf("reopened: %+v, has 3: %v", st, c2.has(key(3)))
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(ents) != 0 {
		t.Fatalf("tmp not cleaned: %v", ents)
	}
	got, ok := c2.read(key(4), nil)
	if !ok || !bytes.Equal(got, obj(4)) {
		t.Fatal("lost an object")
	}
	// A vanished file is a miss and leaves the index.
	os.Remove(filepath.Join(dir, key(4)))
	if _, ok := c2.read(key(4), nil); ok || c2.has(key(4)) {
		t.Fatal("a vanished file was a hit")
	}
}

// An object put behind is found at once; one removed before its write
// (found bad) is not written, and past behindMax a put writes at once.
func TestCachePutBehind(t *testing.T) {
	dir := t.TempDir()
	c, err := OpenCache(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	behindHold = func(string) { <-release }
	defer func(old int64) { behindMax = old }(behindMax)
	behindMax = 2500
	obj := func(i byte) []byte { return bytes.Repeat([]byte{i}, 1000) }
	key := func(i byte) string { return ChunkKey(Sum(obj(i))) }
	c.putBehind(key(1), obj(1))
	c.putBehind(key(2), obj(2))
	c.putBehind(key(3), obj(3)) // past behindMax: written now
	if got, ok := c.read(key(1), nil); !ok || !bytes.Equal(got, obj(1)) {
		t.Fatal("an object held behind was not read")
	}
	dst := make([]byte, 1000)
	if ok, bad := c.readInto(key(2), dst); !ok || bad || !bytes.Equal(dst, obj(2)) {
		t.Fatal("an object held behind was not read into a buffer")
	}
	if st := c.Stats(); st.Behind != 2 || st.BehindBytes != 2000 || st.Objects != 1 {
		t.Fatalf("held: %+v", st)
	}
	c.remove(key(2))
	if c.has(key(2)) {
		t.Fatal("a removed object is still held")
	}
	close(release)
	c.Flush()
	behindHold = nil
	if st := c.Stats(); st.Behind != 0 || st.Objects != 2 || !c.has(key(1)) || c.has(key(2)) {
		t.Fatalf("after the writes: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(dir, key(2))); !os.IsNotExist(err) {
		t.Fatalf("the removed object was written: %v", err)
	}
}
