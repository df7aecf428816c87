package envd

import (
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchBarrierRoot holds one directory per polling watcher, where the
// agent makes barriers. Only root can enter it. Read when a watcher is
// made (tests point it elsewhere before starting their agent).
var watchBarrierRoot = "/run/cellfork-agent/watch"

// barrierWait bounds how long a poll waits for its barrier.
const barrierWait = 500 * time.Millisecond

// barrier orders a poll after the changes made before it. A write that
// returned has queued its inotify events in the kernel, but the watcher
// reads them a moment later: a GetWatcherEvents right after the write
// could miss them. The poll therefore makes a directory named by a
// sequence number in the watcher's own barrier directory, watched by the
// same inotify instance; inotify delivers in order, so once that event
// has been handled, so has everything queued before it. Safe for
// concurrent use; a nil *barrier does nothing.
type barrier struct {
	dir  string
	next atomic.Uint64
}

// newBarrier makes the watcher's barrier directory under root and watches
// it; nil (no barrier, polls answer with what has arrived) if it cannot.
func newBarrier(root string, w *fsnotify.Watcher) *barrier {
	if err := os.MkdirAll(root, 0o700); err != nil {
		log.Printf("watch barriers: %v", err)
		return nil
	}
	dir, err := os.MkdirTemp(root, "w")
	if err != nil {
		log.Printf("watch barriers: %v", err)
		return nil
	}
	if err := w.Add(dir); err != nil {
		log.Printf("watch barriers: watching %s: %v", dir, err)
		_ = os.RemoveAll(dir)
		return nil
	}
	return &barrier{dir: dir}
}

// raise makes barrier n and returns n; false if there is no barrier.
func (b *barrier) raise() (uint64, bool) {
	if b == nil {
		return 0, false
	}
	n := b.next.Add(1)
	p := filepath.Join(b.dir, strconv.FormatUint(n, 10))
	if err := os.Mkdir(p, 0o700); err != nil {
		return 0, false
	}
	_ = os.Remove(p) // its creation is queued; that is all it is for
	return n, true
}

// reached returns the barrier ev announces, if it is one of b's.
func (b *barrier) reached(ev fsnotify.Event) (uint64, bool) {
	if b == nil || !ev.Has(fsnotify.Create) || filepath.Dir(ev.Name) != b.dir {
		return 0, false
	}
	n, err := strconv.ParseUint(filepath.Base(ev.Name), 10, 64)
	return n, err == nil
}

// remove deletes the barrier directory.
func (b *barrier) remove() {
	if b != nil {
		_ = os.RemoveAll(b.dir)
	}
}

// isBarrierPath reports whether p is in the agent's barrier directories,
// whose events no watcher reports (a recursive watch of / sees them).
func (d *dirWatcher) isBarrierPath(p string) bool {
	return d.barrierRoot != "" && (p == d.barrierRoot || strings.HasPrefix(p, d.barrierRoot+"/"))
}
