package envd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"

	"github.com/cellfork/cellfork/internal/envd/filesystem"
)

// maxPolledEvents bounds the events a polling watcher keeps between two
// GetWatcherEvents calls; older events are dropped first.
const maxPolledEvents = 10000

// Filesystem magic numbers of network filesystems (linux/magic.h), which
// are refused unless allowNetworkMounts is set, as in upstream envd.
var networkMagics = map[int64]bool{0x6969: true, 0xFF534D42: true, 0x517B: true, 0xFE534D42: true, 0x65735546: true}

// dirWatcher turns fsnotify events under root into FilesystemEvents,
// adding watches for new subdirectories when recursive. Safe for
// concurrent use.
type dirWatcher struct {
	root         string
	recursive    bool
	includeEntry bool
	w            *fsnotify.Watcher
	events       chan watchItem // closed when the watcher stops
	errs         chan error     // at most one error
	stop         chan struct{}
	stopOnce     sync.Once
	barrierRoot  string   // the agent's barrier directories, never reported
	barrier      *barrier // nil when the agent has no barrier directory
}

// watchItem is an event, or a barrier that every event before it has
// passed (barrier > 0).
type watchItem struct {
	ev      *filesystem.FilesystemEvent
	barrier uint64
}

type watchOptions struct {
	path                                  string
	recursive, includeEntry, allowNetwork bool
	polled                                bool   // CreateWatcher's: polls need barriers
	barrierRoot                           string // watchBarrierRoot
}

func newDirWatcher(o watchOptions) (*dirWatcher, error) {
	fi, err := os.Stat(o.path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil, notFoundf("path not found: %s", o.path)
		}
		return nil, fmt.Errorf("stating %s: %w", o.path, err)
	}
	if !fi.IsDir() {
		return nil, invalidf("path is not a directory: %s", o.path)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(o.path, &st); err == nil && networkMagics[int64(st.Type)] && !o.allowNetwork {
		return nil, invalidf("cannot watch %s: it is on a network filesystem", o.path)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("creating watcher: %w", err)
	}
	d := &dirWatcher{
		root: o.path, recursive: o.recursive, includeEntry: o.includeEntry, w: w,
		events: make(chan watchItem, 256),
		errs:   make(chan error, 1),
		stop:   make(chan struct{}),
	}
	if err := w.Add(o.path); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("watching %s: %w", o.path, err)
	}
	d.barrierRoot = o.barrierRoot
	if o.polled && o.barrierRoot != "" {
		d.barrier = newBarrier(o.barrierRoot, w) // nil if it cannot be made
	}
	if o.recursive {
		d.addTree(o.path, false)
	}
	go d.run()
	return d, nil
}

// close stops the watcher; events is closed soon after.
func (d *dirWatcher) close() {
	d.stopOnce.Do(func() {
		close(d.stop)
		_ = d.w.Close()
		d.barrier.remove()
	})
}

// addTree watches the directories below dir. With announce, it also emits
// CREATE (and WRITE for non-empty files) for everything found, since
// entries made before the watch was set up produce no event of their own
// (`mkdir -p a/b && echo x > a/b/f`).
func (d *dirWatcher) addTree(dir string, announce bool) {
	_ = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		if d.isBarrierPath(p) {
			return filepath.SkipDir
		}
		if announce {
			op := fsnotify.Create
			if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
				op |= fsnotify.Write
			}
			d.emit(p, op)
		}
		if e.IsDir() {
			_ = d.w.Add(p) // best effort: inotify watch limits
		}
		return nil
	})
}

func (d *dirWatcher) run() {
	defer close(d.events)
	for {
		select {
		case ev, ok := <-d.w.Events:
			if !ok {
				return
			}
			d.handle(ev)
		case err, ok := <-d.w.Errors:
			if !ok {
				return
			}
			select {
			case d.errs <- fmt.Errorf("watching %s: %w", d.root, err):
			default:
			}
		case <-d.stop:
			return
		}
	}
}

func (d *dirWatcher) handle(ev fsnotify.Event) {
	if d.isBarrierPath(ev.Name) {
		// The agent's own: never reported. This watcher's barrier says
		// that every event before it was handled.
		if n, ok := d.barrier.reached(ev); ok {
			select {
			case d.events <- watchItem{barrier: n}:
			case <-d.stop:
			}
		}
		return
	}
	d.emit(ev.Name, ev.Op)
	if !d.recursive {
		return
	}
	if ev.Has(fsnotify.Create) {
		if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
			_ = d.w.Add(ev.Name)
			d.addTree(ev.Name, true)
		}
	}
	if ev.Has(fsnotify.Rename) || ev.Has(fsnotify.Remove) {
		_ = d.w.Remove(ev.Name) // the new name arrives as a Create
	}
}

var eventTypes = []struct {
	op fsnotify.Op
	t  filesystem.EventType
}{
	{fsnotify.Create, filesystem.EventType_EVENT_TYPE_CREATE},
	{fsnotify.Rename, filesystem.EventType_EVENT_TYPE_RENAME},
	{fsnotify.Chmod, filesystem.EventType_EVENT_TYPE_CHMOD},
	{fsnotify.Write, filesystem.EventType_EVENT_TYPE_WRITE},
	{fsnotify.Remove, filesystem.EventType_EVENT_TYPE_REMOVE},
}

// emit sends one FilesystemEvent per operation in op.
func (d *dirWatcher) emit(path string, op fsnotify.Op) {
	name, err := filepath.Rel(d.root, path)
	if err != nil {
		return
	}
	var entry *filesystem.EntryInfo
	if d.includeEntry {
		if fi, err := os.Lstat(path); err == nil {
			entry = entryFromInfo(path, fi, newIDNames())
		}
	}
	for _, et := range eventTypes {
		if !op.Has(et.op) {
			continue
		}
		select {
		case d.events <- watchItem{ev: &filesystem.FilesystemEvent{Name: name, Type: et.t, Entry: entry}}:
		case <-d.stop:
			return
		}
	}
}

// WatchDir streams filesystem events under a directory: start{} first, then
// events and keepalives until the client goes away.
func (s *fsService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	d, err := s.openWatcher(req.Header(), watchOptions{
		path: req.Msg.GetPath(), recursive: req.Msg.GetRecursive(),
		includeEntry: req.Msg.GetIncludeEntry(), allowNetwork: req.Msg.GetAllowNetworkMounts(),
	})
	if err != nil {
		return connectError("WatchDir", err)
	}
	defer d.close()
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keepalive := keepaliveInterval(req.Header())
	timer := time.NewTimer(keepalive)
	defer timer.Stop()
	for {
		var msg *filesystem.WatchDirResponse
		select {
		case it, ok := <-d.events:
			if !ok {
				return connectError("WatchDir", errors.New("watcher stopped"))
			}
			if it.ev == nil {
				continue // a barrier: streams need none
			}
			msg = &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: it.ev}}
		case err := <-d.errs:
			return connectError("WatchDir", err)
		case <-timer.C:
			msg = &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}
		case <-ctx.Done():
			return nil
		}
		timer.Reset(keepalive)
		if err := stream.Send(msg); err != nil {
			return err
		}
	}
}

func (s *fsService) openWatcher(h http.Header, o watchOptions) (*dirWatcher, error) {
	_, path, err := s.resolve(h, o.path)
	if err != nil {
		return nil, err
	}
	o.path = path
	o.barrierRoot = watchBarrierRoot
	return newDirWatcher(o)
}

// polledWatcher buffers the events of a dirWatcher for GetWatcherEvents.
// Safe for concurrent use.
type polledWatcher struct {
	d *dirWatcher

	mu      sync.Mutex
	events  []*filesystem.FilesystemEvent
	err     error
	reached uint64        // the last barrier collected
	moved   chan struct{} // closed and replaced when reached moves
}

func newPolledWatcher(d *dirWatcher) *polledWatcher {
	p := &polledWatcher{d: d, moved: make(chan struct{})}
	go p.collect()
	return p
}

func (p *polledWatcher) collect() {
	for {
		select {
		case it, ok := <-p.d.events:
			if !ok {
				return
			}
			p.mu.Lock()
			if it.ev == nil {
				p.reached = max(p.reached, it.barrier)
				close(p.moved)
				p.moved = make(chan struct{})
				p.mu.Unlock()
				continue
			}
			if len(p.events) >= maxPolledEvents {
				p.events = p.events[1:]
			}
			p.events = append(p.events, it.ev)
			p.mu.Unlock()
		case err := <-p.d.errs:
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
		}
	}
}

// drain waits, up to barrierWait, until every event the kernel had queued
// for the watcher when drain was called has been collected: a write that
// returned before this poll is in its answer.
func (p *polledWatcher) drain(ctx context.Context) {
	n, ok := p.d.barrier.raise()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, barrierWait)
	defer cancel()
	for {
		p.mu.Lock()
		done, moved := p.reached >= n, p.moved
		p.mu.Unlock()
		if done {
			return
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return // answer with what arrived
		}
	}
}

// take returns and clears the buffered events.
func (p *polledWatcher) take() ([]*filesystem.FilesystemEvent, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	evs, err := p.events, p.err
	p.events, p.err = nil, nil
	return evs, err
}

// watcherRegistry holds the polling watchers by id. Safe for concurrent use.
type watcherRegistry struct {
	mu       sync.Mutex
	watchers map[string]*polledWatcher
}

func newWatcherRegistry() *watcherRegistry {
	return &watcherRegistry{watchers: map[string]*polledWatcher{}}
}

func (r *watcherRegistry) get(id string) (*polledWatcher, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.watchers[id]; ok {
		return p, nil
	}
	return nil, notFoundf("watcher %q not found", id)
}

// CreateWatcher starts a watcher whose events are fetched by polling.
func (s *fsService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	d, err := s.openWatcher(req.Header(), watchOptions{
		path: req.Msg.GetPath(), recursive: req.Msg.GetRecursive(),
		includeEntry: req.Msg.GetIncludeEntry(), allowNetwork: req.Msg.GetAllowNetworkMounts(),
		polled: true,
	})
	if err != nil {
		return nil, connectError("CreateWatcher", err)
	}
	p := newPolledWatcher(d)
	id := requestID()
	s.watchers.mu.Lock()
	s.watchers.watchers[id] = p
	s.watchers.mu.Unlock()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

// GetWatcherEvents returns the events since the previous call, including
// those of every change made before the call (see drain).
func (s *fsService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	p, err := s.watchers.get(req.Msg.GetWatcherId())
	if err != nil {
		return nil, connectError("GetWatcherEvents", err)
	}
	p.drain(ctx)
	evs, err := p.take()
	if err != nil {
		return nil, connectError("GetWatcherEvents", err)
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

// RemoveWatcher stops a polling watcher.
func (s *fsService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	id := req.Msg.GetWatcherId()
	p, err := s.watchers.get(id)
	if err != nil {
		return nil, connectError("RemoveWatcher", err)
	}
	s.watchers.mu.Lock()
	delete(s.watchers.watchers, id)
	s.watchers.mu.Unlock()
	p.d.close()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
