package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Unpack writes img's flattened file system (whiteouts applied) into dir,
// which must exist and be empty. At most maxBytes of file content are
// written (0: no limit); past that it fails with ErrResourceExhausted.
func Unpack(ctx context.Context, img v1.Image, dir string, maxBytes int64) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	if err := Extract(ctx, rc, dir, maxBytes); err != nil {
		return fmt.Errorf("unpacking image: %w", err)
	}
	// mutate.Extract ends its archive before it reports a failure (a layer
	// that could not be fetched): the failure is what follows the end.
	if _, err := io.Copy(io.Discard, rc); err != nil {
		return errdefs.New(errdefs.ErrUnavailable, "reading the image's layers: %v", err)
	}
	return nil
}

// Extract writes the entries of the tar stream r under root, as root owns
// them in the archive (owners, modes with set-id bits, times). It never
// writes outside root: entry names are cleaned and every existing symbolic
// link on the way to an entry is resolved inside root (a link to /etc
// leads to root/etc). Device nodes are skipped (a sandbox gets its own
// /dev). Later entries replace earlier ones, as when a layer is applied.
func Extract(ctx context.Context, r io.Reader, root string, maxBytes int64) error {
	x := extractor{root: root, max: maxBytes}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errdefs.New(errdefs.ErrInvalidArgument, "reading archive: %v", err)
		}
		if err := x.entry(h, tr); err != nil {
			return err
		}
	}
	return x.finish()
}

type extractor struct {
	root    string
	max     int64
	written int64
	dirs    []dirTimes // applied last: creating children changes them
	links   []*tar.Header
}

type dirTimes struct {
	path         string
	atime, mtime time.Time
}

// cleanRel cleans an archive name to a path relative to the root; false if
// it would leave the root.
func cleanRel(name string) (string, bool) {
	n := path.Clean("/" + strings.ReplaceAll(name, "\\", "/"))
	rel := strings.TrimPrefix(n, "/")
	if rel == "" {
		return ".", true
	}
	return rel, !strings.HasPrefix(rel, "../") && rel != ".."
}

// parent returns the host path of rel's parent directory (symbolic links
// resolved inside the root), creating missing directories.
func (x *extractor) parent(rel string) (string, error) {
	dir, err := securejoin.SecureJoin(x.root, path.Dir(rel))
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", rel, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return dir, nil
}

func (x *extractor) entry(h *tar.Header, r io.Reader) error {
	rel, ok := cleanRel(h.Name)
	if !ok {
		return errdefs.New(errdefs.ErrInvalidArgument, "archive entry %q escapes the root", h.Name)
	}
	if rel == "." {
		if h.Typeflag == tar.TypeDir {
			return x.attrs(x.root, h)
		}
		return nil
	}
	switch h.Typeflag {
	case tar.TypeChar, tar.TypeBlock, tar.TypeXGlobalHeader:
		return nil
	case tar.TypeLink:
		x.links = append(x.links, h) // after the files they name
		return nil
	}
	dir, err := x.parent(rel)
	if err != nil {
		return err
	}
	p := filepath.Join(dir, path.Base(rel))
	fi, err := os.Lstat(p)
	exists := err == nil
	if exists && !(fi.IsDir() && h.Typeflag == tar.TypeDir) {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if !exists || !fi.IsDir() {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
		}
		x.dirs = append(x.dirs, dirTimes{p, h.AccessTime, h.ModTime})
	case tar.TypeReg, tar.TypeRegA:
		if x.max > 0 && x.written+h.Size > x.max {
			return errdefs.New(errdefs.ErrResourceExhausted, "the image's files exceed the build disk limit of %d MiB", x.max>>20)
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		n, err := io.Copy(f, r)
		x.written += n
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("writing %s: %w", rel, err)
		}
	case tar.TypeSymlink:
		if err := os.Symlink(h.Linkname, p); err != nil {
			return err
		}
	case tar.TypeFifo:
		if err := unix.Mkfifo(p, 0o600); err != nil {
			return err
		}
	default:
		return nil // unknown kinds are not part of a root file system
	}
	return x.attrs(p, h)
}

// attrs sets owner, mode and (for files and links) times of p from h.
func (x *extractor) attrs(p string, h *tar.Header) error {
	if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
		return fmt.Errorf("chown %s: %w", p, err)
	}
	if h.Typeflag == tar.TypeSymlink {
		ts := []unix.Timespec{unix.NsecToTimespec(h.AccessTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
		return nil
	}
	// After chown, which clears set-id bits.
	if err := os.Chmod(p, h.FileInfo().Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky)); err != nil {
		return fmt.Errorf("chmod %s: %w", p, err)
	}
	if h.Typeflag != tar.TypeDir {
		_ = os.Chtimes(p, orNow(h.AccessTime, h.ModTime), h.ModTime)
	}
	return nil
}

func orNow(t, fallback time.Time) time.Time {
	if t.IsZero() {
		return fallback
	}
	return t
}

// finish makes the hard links (once the files they name exist) and sets
// the directories' times.
func (x *extractor) finish() error {
	for _, h := range x.links {
		rel, ok := cleanRel(h.Name)
		target, tok := cleanRel(h.Linkname)
		if !ok || !tok || rel == "." || target == "." {
			return errdefs.New(errdefs.ErrInvalidArgument, "hard link %q -> %q escapes the root", h.Name, h.Linkname)
		}
		tdir, err := securejoin.SecureJoin(x.root, path.Dir(target))
		if err != nil {
			return err
		}
		src := filepath.Join(tdir, path.Base(target))
		if fi, err := os.Lstat(src); err != nil || fi.IsDir() {
			continue // a link to nothing (or to a directory) is dropped
		}
		dir, err := x.parent(rel)
		if err != nil {
			return err
		}
		p := filepath.Join(dir, path.Base(rel))
		if err := os.RemoveAll(p); err != nil {
			return err
		}
		// linkat without AT_SYMLINK_FOLLOW links a symbolic link itself.
		if err := unix.Linkat(unix.AT_FDCWD, src, unix.AT_FDCWD, p, 0); err != nil && !errors.Is(err, unix.EXDEV) {
			return fmt.Errorf("linking %s: %w", rel, err)
		}
	}
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		_ = os.Chtimes(d.path, orNow(d.atime, d.mtime), d.mtime)
	}
	return nil
}
