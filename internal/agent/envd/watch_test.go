package envd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/envd/filesystem"
)

func eventKey(ev *filesystem.FilesystemEvent) string {
	return ev.GetType().String() + " " + ev.GetName()
}

func TestWatchDirStream(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := connect.NewRequest(&filesystem.WatchDirRequest{Path: e.dir, Recursive: true, IncludeEntry: true})
	req.Header().Set("Keepalive-Ping-Interval", "1")
	s, err := e.fs.WatchDir(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Receive() || s.Msg().GetStart() == nil {
		t.Fatalf("first message = %v (%v)", s.Msg(), s.Err())
	}

	mustWrite(t, filepath.Join(e.dir, "top.txt"), "x")
	if err := os.MkdirAll(filepath.Join(e.dir, "sub", "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	seen := map[string]*filesystem.FilesystemEvent{}
	keepalives := 0
	wait := func(keys ...string) {
		t.Helper()
		for !hasAll(seen, keys) {
			if !s.Receive() {
				t.Fatalf("stream ended waiting for %v, have %v: %v", keys, seen, s.Err())
			}
			if ev := s.Msg().GetFilesystem(); ev != nil {
				seen[eventKey(ev)] = ev
			} else if s.Msg().GetKeepalive() != nil {
				keepalives++
			}
		}
	}
	wait("EVENT_TYPE_CREATE top.txt", "EVENT_TYPE_WRITE top.txt", "EVENT_TYPE_CREATE sub", "EVENT_TYPE_CREATE sub/deep")
	if en := seen["EVENT_TYPE_CREATE top.txt"].GetEntry(); en.GetPath() != filepath.Join(e.dir, "top.txt") || en.GetType() != filesystem.FileType_FILE_TYPE_FILE {
		t.Fatalf("entry = %v", en)
	}
	// New subdirectories are watched too.
	time.Sleep(100 * time.Millisecond)
	mustWrite(t, filepath.Join(e.dir, "sub", "deep", "f"), "y")
	if err := os.Rename(filepath.Join(e.dir, "top.txt"), filepath.Join(e.dir, "renamed.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(e.dir, "renamed.txt")); err != nil {
		t.Fatal(err)
	}
	wait("EVENT_TYPE_CREATE sub/deep/f", "EVENT_TYPE_RENAME top.txt", "EVENT_TYPE_CREATE renamed.txt", "EVENT_TYPE_REMOVE renamed.txt")
	if seen["EVENT_TYPE_REMOVE renamed.txt"].Entry != nil {
		t.Fatal("a removed file has an entry")
	}
	// A file written into fresh directories before they are watched is
	// still reported as created and written.
	mustWrite(t, filepath.Join(e.dir, "n1", "n2", "n3", "f"), "z")
	wait("EVENT_TYPE_CREATE n1/n2/n3", "EVENT_TYPE_CREATE n1/n2/n3/f", "EVENT_TYPE_WRITE n1/n2/n3/f")
	for keepalives == 0 {
		if !s.Receive() {
			t.Fatal(s.Err())
		}
		if s.Msg().GetKeepalive() != nil {
			keepalives++
		}
	}
}

func hasAll(seen map[string]*filesystem.FilesystemEvent, keys []string) bool {
	for _, k := range keys {
		if _, ok := seen[k]; !ok {
			return false
		}
	}
	return true
}

func TestWatchDirErrors(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	mustWrite(t, filepath.Join(e.dir, "file"), "")
	for path, code := range map[string]connect.Code{
		filepath.Join(e.dir, "missing"): connect.CodeNotFound,
		filepath.Join(e.dir, "file"):    connect.CodeInvalidArgument,
	} {
		s, err := e.fs.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: path}))
		if err == nil {
			s.Receive()
			err = s.Err()
		}
		wantCode(t, err, code)
		_, err = e.fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: path}))
		wantCode(t, err, code)
	}
}

func TestPollingWatcher(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	res, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: e.dir}))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetWatcherId()
	mustWrite(t, filepath.Join(e.dir, "a"), "1")
	if err := os.Mkdir(filepath.Join(e.dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(e.dir, "d", "not-recursive"), "1")
	var keys []string
	poll(t, "watcher events", func() bool {
		r, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range r.Msg.GetEvents() {
			keys = append(keys, eventKey(ev))
			if ev.Entry != nil {
				t.Fatal("entry without includeEntry")
			}
		}
		return slices.Contains(keys, "EVENT_TYPE_CREATE a") && slices.Contains(keys, "EVENT_TYPE_CREATE d")
	})
	time.Sleep(100 * time.Millisecond)
	r, _ := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
	for _, ev := range append(r.Msg.GetEvents(), nil) {
		if ev != nil && ev.GetName() == "d/not-recursive" {
			t.Fatal("non-recursive watcher saw a nested file")
		}
	}
	if _, err := e.fs.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = e.fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.fs.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
}

// TestPollSeesPrecedingWrite: a poll that follows a write answers with the
// write's events, every time (the poll drains what the kernel queued).
func TestPollSeesPrecedingWrite(t *testing.T) {
	// The barriers inside the watched tree: they must not show. Set before
	// the agent starts and restored after it stopped (cleanups run last
	// first).
	root, dir := watchBarrierRoot, t.TempDir()
	watchBarrierRoot = filepath.Join(dir, ".barriers")
	t.Cleanup(func() { watchBarrierRoot = root })
	e := newEnv(t)
	ctx := ctxTimeout(t, 60*time.Second)
	res, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: dir, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetWatcherId()
	get := func() []string {
		r, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, ev := range r.Msg.GetEvents() {
			keys = append(keys, eventKey(ev))
		}
		return keys
	}
	for i := range 200 {
		name := fmt.Sprintf("f%d", i)
		mustWrite(t, filepath.Join(dir, name), "x")
		keys := get()
		if !slices.Contains(keys, "EVENT_TYPE_WRITE "+name) {
			t.Fatalf("write %d: the poll right after it answered %v", i, keys)
		}
		for _, k := range keys {
			if strings.Contains(k, ".barriers") {
				t.Fatalf("a barrier showed as an event: %s", k)
			}
		}
	}
	if _, err := e.fs.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(watchBarrierRoot); len(left) != 0 {
		t.Fatalf("barrier directories left: %v", left)
	}
}
