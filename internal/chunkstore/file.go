package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// FileBackend keeps objects as files under a directory: the single-host
// default. Puts write a temporary file and rename it, so a crash leaves
// whole objects or none (and temporary files, removed by the next
// OpenFile). Safe for concurrent use, by several processes too.
type FileBackend struct {
	dir string
}

// OpenFile opens (creating it) the store in dir.
func OpenFile(dir string) (*FileBackend, error) {
	if !filepath.IsAbs(dir) {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "file store %q: want an absolute path", dir)
	}
	for _, d := range []string{"chunks", "manifests", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("opening file store %s: %w", dir, err)
		}
	}
	// Leftovers of puts cut short by a crash. (A put under way in another
	// process loses its file and fails; it is retried.)
	if ents, err := os.ReadDir(filepath.Join(dir, "tmp")); err == nil {
		for _, e := range ents {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Hour {
				os.Remove(filepath.Join(dir, "tmp", e.Name()))
			}
		}
	}
	return &FileBackend{dir: dir}, nil
}

func (b *FileBackend) String() string { return "file://" + b.dir }

func (b *FileBackend) path(key string) (string, error) {
	if err := validKey(key); err != nil {
		return "", err
	}
	return filepath.Join(b.dir, filepath.FromSlash(key)), nil
}

// validKey refuses keys that could leave the store's directory or collide
// with its own files.
func validKey(key string) error {
	if key == "" || strings.HasPrefix(key, "tmp/") {
		return errdefs.New(errdefs.ErrInvalidArgument, "object key %q", key)
	}
	for _, p := range strings.Split(key, "/") {
		// No empty, hidden (lock files), "." or ".." parts.
		if p == "" || strings.HasPrefix(p, ".") || strings.ContainsAny(p, "\\\x00") {
			return errdefs.New(errdefs.ErrInvalidArgument, "object key %q", key)
		}
	}
	return nil
}

func fileErr(op, key string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s %s: %w", op, key, errdefs.ErrNotFound)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%s %s: %v: %w", op, key, err, errdefs.ErrResourceExhausted)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

func (b *FileBackend) Get(ctx context.Context, key string) ([]byte, error) {
	p, err := b.path(key)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fileErr("reading", key, err)
	}
	return data, nil
}

// GetInto reads the object into dst, which must be its size.
func (b *FileBackend) GetInto(ctx context.Context, key string, dst []byte) error {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return fileErr("reading", key, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return fileErr("reading", key, err)
	} else if fi.Size() != int64(len(dst)) {
		return fmt.Errorf("reading %s: %d bytes, want %d: %w", key, fi.Size(), len(dst), errdefs.ErrCorrupt)
	}
	if _, err := io.ReadFull(f, dst); err != nil {
		return fileErr("reading", key, err)
	}
	return nil
}

func (b *FileBackend) Put(ctx context.Context, key string, data []byte) error {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tmp := filepath.Join(b.dir, "tmp", randomHex(8))
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		os.Remove(tmp)
		return fileErr("writing", key, err)
	}
	// Manifests are few and name everything else: each is synced, after
	// a Flush of the chunks it names.
	if strings.HasPrefix(key, "manifests/") {
		if err := syncFile(tmp); err != nil {
			os.Remove(tmp)
			return fileErr("syncing", key, err)
		}
	}
	err = os.Rename(tmp, p)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(p), 0o700); err == nil {
			err = os.Rename(tmp, p)
		}
	}
	if err != nil {
		os.Remove(tmp)
		return fileErr("writing", key, err)
	}
	if strings.HasPrefix(key, "manifests/") {
		return syncFile(filepath.Dir(p))
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Flush syncs the store's whole filesystem (syncfs(2)): one call for all
// the chunks an export wrote, instead of one fsync each.
func (b *FileBackend) Flush(ctx context.Context) error {
	f, err := os.Open(b.dir)
	if err != nil {
		return fileErr("flushing", b.dir, err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fileErr("flushing", b.dir, err)
	}
	return nil
}

func (b *FileBackend) Has(ctx context.Context, keys []string) ([]bool, error) {
	found := make([]bool, len(keys))
	for i, k := range keys {
		p, err := b.path(k)
		if err != nil {
			return nil, err
		}
		if i%256 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		_, err = os.Lstat(p)
		switch {
		case err == nil:
			found[i] = true
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fileErr("looking up", k, err)
		}
	}
	return found, nil
}

func (b *FileBackend) Delete(ctx context.Context, key string) error {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fileErr("deleting", key, err)
	}
	return nil
}

func (b *FileBackend) List(ctx context.Context, prefix string, fn func(Object) error) error {
	// Walk the deepest directory the prefix names whole.
	start := b.dir
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		if err := validKey(prefix[:i]); err != nil {
			return err
		}
		start = filepath.Join(b.dir, filepath.FromSlash(prefix[:i]))
	}
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed meanwhile, or no such prefix
			}
			return err
		}
		rel, _ := filepath.Rel(b.dir, p)
		key := filepath.ToSlash(rel)
		if d.IsDir() {
			if key == "tmp" || strings.HasPrefix(d.Name(), ".") && p != start {
				return fs.SkipDir
			}
			return ctx.Err()
		}
		if !d.Type().IsRegular() || !strings.HasPrefix(key, prefix) || strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		return fn(Object{Key: key, Size: info.Size(), Modified: info.ModTime()})
	})
	if err != nil {
		return fmt.Errorf("listing %s in %s: %w", prefix, b, err)
	}
	return nil
}

// Lock takes flock(2) on the lock's file (.lock-<name>), polling until ctx
// is done. A flock is never lost while its holder lives.
func (b *FileBackend) Lock(ctx context.Context, name string, exclusive bool) (context.Context, func(), error) {
	if name == "" || strings.ContainsAny(name, "/\\\x00") {
		return nil, nil, errdefs.New(errdefs.ErrInvalidArgument, "lock name %q", name)
	}
	f, err := os.OpenFile(filepath.Join(b.dir, ".lock-"+name), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, nil, fileErr("locking", b.dir, err)
	}
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, nil, fileErr("locking", b.dir, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, nil, fmt.Errorf("waiting for the lock of %s: %w", b, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	held, cancel := context.WithCancel(ctx)
	return held, func() { cancel(); f.Close() }, nil
}

// GetRange reads n bytes of the object from off (fewer at its end).
func (b *FileBackend) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	p, err := b.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fileErr("reading", key, err)
	}
	defer f.Close()
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fileErr("reading", key, err)
	}
	return buf[:got], nil
}
