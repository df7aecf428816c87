package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// watcher reports when sandbox processes exit. runsc's sandboxes are not
// our children, so it holds a pidfd per sandbox and one goroutine waits on
// all of them with epoll. Safe for concurrent use.
type watcher struct {
	once sync.Once
	ep   int
	mu   sync.Mutex
	fns  map[int32]func() // pidfd -> callback; guarded by mu
}

func (w *watcher) start() error {
	var err error
	w.once.Do(func() {
		w.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return
		}
		w.fns = map[int32]func(){}
		go w.loop()
	})
	return err
}

func (w *watcher) loop() {
	events := make([]unix.EpollEvent, 32)
	for {
		n, err := unix.EpollWait(w.ep, events, -1)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return
		}
		for _, ev := range events[:n] {
			w.mu.Lock()
			fn := w.fns[ev.Fd]
			delete(w.fns, ev.Fd)
			w.mu.Unlock()
			_ = unix.EpollCtl(w.ep, unix.EPOLL_CTL_DEL, int(ev.Fd), nil)
			unix.Close(int(ev.Fd))
			if fn != nil {
				go fn()
			}
		}
	}
}

// add calls fn once when process pid exits (at once if it is gone).
func (w *watcher) add(pid int, fn func()) error {
	if err := w.start(); err != nil {
		return err
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if err == unix.ESRCH {
			go fn()
			return nil
		}
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	w.mu.Lock()
	w.fns[int32(fd)] = fn
	w.mu.Unlock()
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(w.ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		w.mu.Lock()
		delete(w.fns, int32(fd))
		w.mu.Unlock()
		unix.Close(fd)
		return err
	}
	return nil
}

// Watch calls onExit once when the sandbox's process exits for any reason
// (killed by the host's OOM killer, crashed, destroyed). Callers tell a
// death from their own Destroy by their own bookkeeping. It reads the pid
// runsc wrote into the bundle: no runsc call, so it is cheap.
func (r *Runtime) Watch(_ context.Context, bundleDir string, onExit func()) error {
	b, err := os.ReadFile(filepath.Join(bundleDir, "pid"))
	if err != nil {
		return fmt.Errorf("reading sandbox pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return fmt.Errorf("bad sandbox pid %q", b)
	}
	return r.watch.add(pid, onExit)
}
