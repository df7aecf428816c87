package layers

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// A layer travels between the hosts of a cluster as a tar stream of its
// diff directory exactly as overlayfs left it: whiteouts stay 0/0
// character devices, an opaque directory keeps its mark (as a PAX xattr
// record), files linked to each other inside the layer stay linked. Adopt
// rebuilds the layer under the same id on another host, so a template's
// chain of layer ids means the same files everywhere.

const opaqueXattr = "trusted.overlay.opaque"

// Pack writes layer id's files to w as a tar stream. A base layer that is
// an external root file system (the built-in template's) has no files of
// its own to send: ErrFailedPrecondition.
func (s *Store) Pack(id string, w io.Writer) error {
	l, ok := s.Get(id)
	if !ok {
		return errdefs.New(errdefs.ErrNotFound, "layer %s not found", id)
	}
	if l.External != "" {
		return errdefs.New(errdefs.ErrFailedPrecondition, "layer %s is the external root file system %s", id, l.External)
	}
	return PackDir(s.DiffPath(id), w, nil)
}

// PackDir writes the files under root to w as Pack does, leaving out the
// directories skip names (relative, slash-separated; nil: none). Unpack
// reads it back.
func PackDir(root string, w io.Writer, skip func(rel string) bool) error {
	tw := tar.NewWriter(w)
	seen := map[[2]uint64]string{} // inode -> first name, for hard links
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if skip != nil && d.IsDir() && rel != "." && skip(filepath.ToSlash(rel)) {
			return fs.SkipDir
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(fi.Mode().Perm()), Uid: int(st.Uid), Gid: int(st.Gid),
			ModTime: fi.ModTime(), Format: tar.FormatPAX}
		if fi.Mode()&os.ModeSetuid != 0 {
			h.Mode |= 0o4000
		}
		if fi.Mode()&os.ModeSetgid != 0 {
			h.Mode |= 0o2000
		}
		if fi.Mode()&os.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		switch {
		case fi.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
			if opaque(p) {
				h.PAXRecords = map[string]string{"SCHILY.xattr." + opaqueXattr: "y"}
			}
		case fi.Mode().IsRegular():
			ino := [2]uint64{uint64(st.Dev), st.Ino}
			if first, ok := seen[ino]; ok && st.Nlink > 1 {
				h.Typeflag, h.Linkname = tar.TypeLink, first
				break
			}
			seen[ino] = h.Name
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		case fi.Mode()&os.ModeSymlink != 0:
			if h.Linkname, err = os.Readlink(p); err != nil {
				return err
			}
			h.Typeflag = tar.TypeSymlink
		case isWhiteout(fi, st):
			h.Typeflag = tar.TypeChar
		case fi.Mode()&os.ModeNamedPipe != 0:
			h.Typeflag = tar.TypeFifo
		default:
			return nil // devices and sockets are not part of a layer
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, h.Size)
			f.Close()
			if err != nil {
				return fmt.Errorf("packing %s: %w", rel, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// Adopt makes layer l (its id, key, parent, step and meta as another host
// recorded them) from the tar stream r that Pack wrote there. A layer of
// that id already here is kept as it is. Nothing is left behind on error.
func (s *Store) Adopt(l Layer, r io.Reader) (*Layer, error) {
	if have, ok := s.Get(l.ID); ok {
		return have, nil
	}
	if l.ID == "" || strings.ContainsAny(l.ID, "/.") || l.External != "" {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "layer %q cannot be adopted", l.ID)
	}
	tmp := filepath.Join(s.dir, l.ID+".tmp-"+newID()[:6])
	diff := filepath.Join(tmp, "diff")
	if err := os.MkdirAll(diff, 0o755); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	if err := Unpack(r, diff); err != nil {
		return nil, fmt.Errorf("layer %s: %w", l.ID, err)
	}
	size, err := DiskUsage(nil, diff)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	l.Size, l.Create, l.Used = size, now, now
	if err := writeJSON(filepath.Join(tmp, "layer.json"), &l); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, l.ID)); err != nil {
		if have, found := s.Get(l.ID); found { // adopted meanwhile
			return have, nil
		}
		return nil, err
	}
	ok = true
	s.mu.Lock()
	s.add(&l)
	s.mu.Unlock()
	c := l
	return &c, nil
}

// Unpack writes Pack's (or PackDir's) stream under root, an existing
// directory. Entries come parents first; an entry whose parent is not a
// directory this stream made (a symbolic link on the way) is refused, so
// nothing is written outside root.
func Unpack(r io.Reader, root string) error {
	tr := tar.NewReader(r)
	var dirs []dirTime
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errdefs.New(errdefs.ErrCorrupt, "reading the layer's archive: %v", err)
		}
		rel := path.Clean("/" + h.Name)[1:]
		if rel == "" {
			if h.Typeflag == tar.TypeDir {
				if err := setAttrs(root, h); err != nil {
					return err
				}
				dirs = append(dirs, dirTime{root, h.ModTime})
			}
			continue
		}
		parent, err := securejoin.SecureJoin(root, path.Dir(rel))
		if err != nil || parent != filepath.Join(root, filepath.FromSlash(path.Dir(rel))) {
			return errdefs.New(errdefs.ErrCorrupt, "layer entry %q is not under a directory of the layer", h.Name)
		}
		p := filepath.Join(parent, path.Base(rel))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if v := h.PAXRecords["SCHILY.xattr."+opaqueXattr]; v != "" {
				if err := unix.Lsetxattr(p, opaqueXattr, []byte(v), 0); err != nil {
					return fmt.Errorf("marking %s opaque: %w", rel, err)
				}
			}
			dirs = append(dirs, dirTime{p, h.ModTime})
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("writing %s: %w", rel, err)
			}
		case tar.TypeLink:
			target := path.Clean("/" + h.Linkname)[1:]
			tp, err := securejoin.SecureJoin(root, target)
			if err != nil || tp != filepath.Join(root, filepath.FromSlash(target)) {
				return errdefs.New(errdefs.ErrCorrupt, "layer hard link %q -> %q leaves the layer", h.Name, h.Linkname)
			}
			if err := os.Link(tp, p); err != nil {
				return err
			}
			continue // the first name set the attributes
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		case tar.TypeChar:
			if h.Devmajor != 0 || h.Devminor != 0 {
				return errdefs.New(errdefs.ErrCorrupt, "layer entry %q is a device, not a whiteout", h.Name)
			}
			if err := unix.Mknod(p, unix.S_IFCHR, 0); err != nil {
				return fmt.Errorf("whiteout %s: %w", rel, err)
			}
		case tar.TypeFifo:
			if err := unix.Mkfifo(p, 0o600); err != nil {
				return err
			}
		default:
			return errdefs.New(errdefs.ErrCorrupt, "layer entry %q has kind %q", h.Name, h.Typeflag)
		}
		if err := setAttrs(p, h); err != nil {
			return err
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Chtimes(dirs[i].path, dirs[i].mtime, dirs[i].mtime)
	}
	return nil
}

// setAttrs gives p the owner, mode and time h records.
func setAttrs(p string, h *tar.Header) error {
	if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
		return err
	}
	if h.Typeflag == tar.TypeSymlink {
		ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
		return nil
	}
	if err := os.Chmod(p, h.FileInfo().Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky)); err != nil {
		return err
	}
	if h.Typeflag != tar.TypeDir {
		_ = os.Chtimes(p, h.ModTime, h.ModTime)
	}
	return nil
}
