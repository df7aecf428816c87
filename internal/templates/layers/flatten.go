package layers

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Flatten writes the union of the layers chain (bottom first) into dst,
// which must not exist: directories are made, files are hard links to the
// layers' (a copy where the layers are on another file system), whiteouts
// and opaque directories remove what the layers below had. The result is
// written beside dst and renamed into place, so dst appears complete or
// not at all.
//
// Layers are never written to, and dst's files must not be either: they
// are the layers' files. Sandboxes only read a template's root (their
// writes stay in their own memory overlay).
func (s *Store) Flatten(chain []string, dst string) error {
	tmp := dst + ".tmp-" + newID()[:6]
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	for i, id := range chain {
		src, err := filepath.EvalSymlinks(s.DiffPath(id)) // an external base is a link
		if err != nil {
			return fmt.Errorf("layer %s: %w", id, err)
		}
		if err := apply(src, tmp, i == 0); err != nil {
			return fmt.Errorf("applying layer %s: %w", id, err)
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	ok = true
	return nil
}

type dirTime struct {
	path  string
	mtime time.Time
}

// apply lays the tree src over dst (fresh: dst is empty, nothing to
// replace). WalkDir visits a directory before what it holds, and an
// overlay's upper directory holds every directory on the way to a changed
// file; so by the time an entry is applied, its parents in dst are real
// directories, and no symbolic link in dst is ever followed.
func apply(src, dst string, fresh bool) error {
	var dirs []dirTime
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if fresh && d.Type().IsRegular() {
			// The common case, and the bulk of a base: a link keeps the
			// owner, mode and times; nothing else to look at.
			if err := os.Link(p, target); err == nil || !errors.Is(err, unix.EXDEV) {
				return err
			}
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if rel == "." {
			return copyAttrs(target, fi, st)
		}
		if isWhiteout(fi, st) {
			return os.RemoveAll(target)
		}
		var cur os.FileInfo
		exists := false
		if !fresh {
			var lerr error
			cur, lerr = os.Lstat(target)
			exists = lerr == nil
		}
		if fi.IsDir() {
			switch {
			case exists && cur.IsDir() && opaque(p):
				if err := emptyDir(target); err != nil {
					return err
				}
			case exists && !cur.IsDir():
				if err := os.Remove(target); err != nil {
					return err
				}
				exists = false
			}
			if !exists || !cur.IsDir() {
				if err := os.Mkdir(target, 0o700); err != nil {
					return err
				}
			}
			dirs = append(dirs, dirTime{target, fi.ModTime()})
			return copyAttrs(target, fi, st)
		}
		if exists {
			if err := os.RemoveAll(target); err != nil {
				return err
			}
		}
		switch {
		case fi.Mode().IsRegular():
			if err := os.Link(p, target); err != nil {
				if !errors.Is(err, unix.EXDEV) {
					return err
				}
				if err := copyFile(p, target, fi, st); err != nil {
					return err
				}
			}
			return nil
		case fi.Mode()&os.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(l, target); err != nil {
				return err
			}
			return os.Lchown(target, int(st.Uid), int(st.Gid))
		case fi.Mode()&os.ModeNamedPipe != 0:
			if err := unix.Mkfifo(target, uint32(fi.Mode().Perm())); err != nil {
				return err
			}
			return copyAttrs(target, fi, st)
		}
		return nil // devices and sockets: a sandbox brings its own /dev
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Chtimes(dirs[i].path, dirs[i].mtime, dirs[i].mtime)
	}
	return nil
}

// isWhiteout: overlayfs marks a removed entry with a 0/0 character device.
func isWhiteout(fi os.FileInfo, st *syscall.Stat_t) bool {
	return fi.Mode()&os.ModeCharDevice != 0 && st.Rdev == 0
}

// opaque: overlayfs marks a directory that replaces the one below (rather
// than merging with it) with trusted.overlay.opaque = "y".
func opaque(p string) bool {
	buf := make([]byte, 4)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf)
	return err == nil && n > 0 && buf[0] == 'y'
}

func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func copyAttrs(target string, fi os.FileInfo, st *syscall.Stat_t) error {
	if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	return os.Chmod(target, fi.Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky))
}

func copyFile(src, dst string, fi os.FileInfo, st *syscall.Stat_t) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := copyAttrs(dst, fi, st); err != nil {
		return err
	}
	return os.Chtimes(dst, fi.ModTime(), fi.ModTime())
}

// DiskUsage adds up the blocks of the files under the roots, each inode
// once (layers and the roots flattened from them share inodes). seen, if
// not nil, carries the inodes already counted across calls.
func DiskUsage(seen map[[2]uint64]bool, roots ...string) (int64, error) {
	if seen == nil {
		seen = map[[2]uint64]bool{}
	}
	var total int64
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if p == root && d.Type()&fs.ModeSymlink != 0 {
				return nil // an external base: not ours
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			st := fi.Sys().(*syscall.Stat_t)
			k := [2]uint64{st.Dev, st.Ino}
			if !seen[k] {
				seen[k] = true
				total += st.Blocks * 512
			}
			return nil
		})
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
