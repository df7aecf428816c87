package chunkstore

import (
	"container/list"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Cache is a host-local copy of chunks and manifests, keyed as in the store
// (so shared by every image on the host), and, with Options.LinkFiles,
// whole image files that imports assembled (files/<hash of the file's
// size, mode and chunk list>), within a size budget: the least
// recently used objects go first. It is crash-safe: an object is written to
// a temporary file and renamed, and OpenCache rebuilds the index by
// scanning the directory (oldest files first out). Its contents are
// verified when read, like the store's. Safe for concurrent use; one
// process per directory.
//
// An import puts the chunks it fetched behind it (putBehind): they are
// held in memory, readable at once, and written by a few goroutines of
// the cache's own after the import has returned, up to behindBytes at a
// time. A crash before they are written loses only those copies (a later
// import fetches them again), never the index's truth: an object is in
// the index once its file is renamed into place.
type Cache struct {
	dir    string
	budget int64

	mu    sync.Mutex // guards the fields below
	used  int64
	lru   *list.List // of *cacheEntry, most recently used first
	index map[string]*list.Element

	behind      map[string][]byte // objects put behind, not yet written
	behindQueue []string          // their keys, in the order they came
	behindBytes int64             // in behind
	writers     int               // goroutines writing behind
	drained     *sync.Cond        // on mu: writers fell to 0
}

// Writing behind: at most behindMax bytes held at once (a put past it
// writes at once, in its caller), by at most behindWriters goroutines.
var (
	behindMax     int64 = 256 << 20
	behindWriters       = 4
	// behindHold, if set (tests), is called by a writer before each
	// object it writes.
	behindHold func(key string)
)

type cacheEntry struct {
	key  string
	size int64
}

// CacheStats is a snapshot of a cache's size: the objects written, and
// those held to be written (Behind, BehindBytes).
type CacheStats struct {
	Objects     int
	Bytes       int64
	Budget      int64
	Behind      int
	BehindBytes int64
}

// OpenCache opens (creating it) the cache in dir with a budget in bytes.
func OpenCache(dir string, budget int64) (*Cache, error) {
	if budget <= 0 {
		return nil, fmt.Errorf("chunk cache %s: budget %d: want a positive number of bytes", dir, budget)
	}
	c := &Cache{dir: dir, budget: budget, lru: list.New(), index: make(map[string]*list.Element), behind: make(map[string][]byte)}
	c.drained = sync.NewCond(&c.mu)
	if err := os.RemoveAll(filepath.Join(dir, "tmp")); err != nil {
		return nil, fmt.Errorf("opening chunk cache: %w", err)
	}
	for _, d := range []string{"chunks", "manifests", "files", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("opening chunk cache: %w", err)
		}
	}
	type found struct {
		cacheEntry
		mod time.Time
	}
	var all []found
	for _, d := range []string{"chunks", "manifests", "files"} {
		err := filepath.WalkDir(filepath.Join(dir, d), func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			info, err := e.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			all = append(all, found{cacheEntry{filepath.ToSlash(rel), info.Size()}, info.ModTime()})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("scanning chunk cache %s: %w", dir, err)
		}
	}
	slices.SortFunc(all, func(a, b found) int { return b.mod.Compare(a.mod) })
	for _, f := range all {
		e := f.cacheEntry
		c.index[e.key] = c.lru.PushBack(&e)
		c.used += e.size
	}
	c.evict()
	return c, nil
}

// Stats reports the cache's size.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Objects: len(c.index), Bytes: c.used, Budget: c.budget, Behind: len(c.behind), BehindBytes: c.behindBytes}
}

// Flush waits until every object put behind is written (or failed to be:
// that costs a later miss only).
func (c *Cache) Flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.writers > 0 {
		c.drained.Wait()
	}
}

// Dir is the cache's directory: objects under their keys
// (chunks/ab/ab12..., manifests/...).
func (c *Cache) Dir() string { return c.dir }

func (c *Cache) path(key string) string { return filepath.Join(c.dir, filepath.FromSlash(key)) }

// has reports whether key is cached (without reading it), written or
// held behind.
func (c *Cache) has(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.index[key]
	if !ok {
		_, ok = c.behind[key]
	}
	return ok
}

// held returns the object key if it is held behind, not yet written.
func (c *Cache) held(key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.behind[key]
	return d, ok
}

// read returns the cached object, in buf if it fits, or false. The caller
// verifies what it got (its length too) and calls remove if it is bad.
func (c *Cache) read(key string, buf []byte) ([]byte, bool) {
	if d, ok := c.held(key); ok {
		return append(buf[:0], d...), true
	}
	c.mu.Lock()
	el, ok := c.index[key]
	var size int64
	if ok {
		c.lru.MoveToFront(el)
		size = el.Value.(*cacheEntry).size
	}
	c.mu.Unlock()
	if !ok {
		return nil, false
	}
	f, err := os.Open(c.path(key))
	if err != nil {
		c.remove(key)
		return nil, false
	}
	defer f.Close()
	if int64(cap(buf)) < size+1 {
		buf = make([]byte, size+1)
	}
	// One byte more than expected tells a file that grew; the caller's
	// check of length and hash tells a changed one.
	n, err := io.ReadFull(f, buf[:size+1])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		c.remove(key)
		return nil, false
	}
	return buf[:n], true
}

// readInto fills dst with the cached object's first len(dst) bytes and
// reports true, or false if it is not cached, with bad set if it was but
// could not be read whole (then it is dropped). The caller verifies the
// bytes. Raw system calls: no poller registration, one read for most
// chunks.
func (c *Cache) readInto(key string, dst []byte) (ok, bad bool) {
	if d, held := c.held(key); held {
		if len(d) < len(dst) {
			c.remove(key)
			return false, true
		}
		copy(dst, d)
		return true, false
	}
	c.mu.Lock()
	el, ok := c.index[key]
	if ok {
		c.lru.MoveToFront(el)
	}
	c.mu.Unlock()
	if !ok {
		return false, false
	}
	fd, err := unix.Open(c.path(key), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		c.remove(key)
		return false, true
	}
	defer unix.Close(fd)
	for done := 0; done < len(dst); {
		n, err := unix.Pread(fd, dst[done:], int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			c.remove(key)
			return false, true
		}
		done += n
	}
	return true, false
}

// link hard-links the cached whole file key to dst, or reports false.
func (c *Cache) link(key, dst string) bool {
	c.mu.Lock()
	el, ok := c.index[key]
	if ok {
		c.lru.MoveToFront(el)
	}
	c.mu.Unlock()
	if !ok {
		return false
	}
	if err := os.Link(c.path(key), dst); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			c.remove(key)
		}
		return false
	}
	return true
}

// adopt makes the file at src (finished, never written again) the cached
// whole file key, by a hard link: no copy. A file on another filesystem
// is not adopted.
func (c *Cache) adopt(key, src string, size int64) {
	if c.has(key) || size > c.budget {
		return
	}
	tmp := filepath.Join(c.dir, "tmp", randomHex(8))
	if err := os.Link(src, tmp); err != nil {
		return
	}
	if c.place(tmp, key) {
		c.index1(key, size)
	}
}

// put stores data under key (a no-op if it is cached) and evicts what is
// over the budget. Failures only cost a later miss.
func (c *Cache) put(key string, data []byte) {
	if c.has(key) || int64(len(data)) > c.budget {
		return
	}
	if c.write(key, data) {
		c.index1(key, int64(len(data)))
	}
}

// putBehind is put without waiting for the write: data, which must not
// change, is held (has, read and readInto find it) until one of the
// cache's writers has written it. Past behindMax bytes held, it is put.
func (c *Cache) putBehind(key string, data []byte) {
	if int64(len(data)) > c.budget {
		return
	}
	c.mu.Lock()
	_, in := c.index[key]
	_, held := c.behind[key]
	if in || held {
		c.mu.Unlock()
		return
	}
	if c.behindBytes+int64(len(data)) > behindMax {
		c.mu.Unlock()
		c.put(key, data)
		return
	}
	c.behind[key] = data
	c.behindQueue = append(c.behindQueue, key)
	c.behindBytes += int64(len(data))
	start := c.writers < behindWriters
	if start {
		c.writers++
	}
	c.mu.Unlock()
	if start {
		go c.writeBehind()
	}
}

// writeBehind writes the objects held behind until none is left.
func (c *Cache) writeBehind() {
	for {
		c.mu.Lock()
		if len(c.behindQueue) == 0 {
			c.behindQueue = nil
			c.writers--
			if c.writers == 0 {
				c.drained.Broadcast()
			}
			c.mu.Unlock()
			return
		}
		key := c.behindQueue[0]
		c.behindQueue = c.behindQueue[1:]
		data, ok := c.behind[key]
		c.mu.Unlock()
		if !ok {
			continue // removed meanwhile
		}
		if behindHold != nil {
			behindHold(key)
		}
		ok = c.write(key, data)
		c.mu.Lock()
		_, still := c.behind[key]
		if still {
			// From held to indexed at once: has never misses it.
			delete(c.behind, key)
			c.behindBytes -= int64(len(data))
			if ok {
				c.addLocked(key, int64(len(data)))
			}
		}
		_, in := c.index[key]
		c.mu.Unlock()
		switch {
		case still && ok:
			c.evict()
		case ok && !in:
			os.Remove(c.path(key)) // removed while it was written
		}
	}
}

// write writes data to key's file: to a temporary file, renamed into
// place.
func (c *Cache) write(key string, data []byte) bool {
	tmp := filepath.Join(c.dir, "tmp", randomHex(8))
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		os.Remove(tmp)
		return false
	}
	return c.place(tmp, key)
}

// place renames the finished temporary file tmp to key's file.
func (c *Cache) place(tmp, key string) bool {
	p := c.path(key)
	err := os.Rename(tmp, p)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(p), 0o700); err == nil {
			err = os.Rename(tmp, p)
		}
	}
	if err != nil {
		os.Remove(tmp)
		return false
	}
	return true
}

// index1 adds the written object key to the index and evicts what is
// over the budget.
func (c *Cache) index1(key string, size int64) {
	c.mu.Lock()
	c.addLocked(key, size)
	c.mu.Unlock()
	c.evict()
}

// addLocked adds the written object key to the index; c.mu is held.
func (c *Cache) addLocked(key string, size int64) {
	if _, ok := c.index[key]; !ok {
		c.index[key] = c.lru.PushFront(&cacheEntry{key, size})
		c.used += size
	}
}

// remove drops key (a corrupt or vanished object).
func (c *Cache) remove(key string) {
	c.mu.Lock()
	if d, ok := c.behind[key]; ok {
		delete(c.behind, key)
		c.behindBytes -= int64(len(d))
	}
	if el, ok := c.index[key]; ok {
		c.lru.Remove(el)
		delete(c.index, key)
		c.used -= el.Value.(*cacheEntry).size
	}
	c.mu.Unlock()
	os.Remove(c.path(key))
}

// evict removes the least recently used objects until the cache fits its
// budget.
func (c *Cache) evict() {
	var victims []string
	c.mu.Lock()
	for c.used > c.budget {
		el := c.lru.Back()
		e := el.Value.(*cacheEntry)
		c.lru.Remove(el)
		delete(c.index, e.key)
		c.used -= e.size
		victims = append(victims, e.key)
	}
	c.mu.Unlock()
	for _, k := range victims {
		if !strings.Contains(k, "..") {
			os.Remove(c.path(k))
		}
	}
}
