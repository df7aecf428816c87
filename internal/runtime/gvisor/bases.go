package gvisor

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Copy-on-write images (patches/gvisor: image-cow). A restored sandbox maps
// its private memory from the image's pages file, shared and read-only,
// and copies a page only when it writes it; so a checkpoint of it saves
// references to that image (by id) instead of the pages it never wrote, and
// restoring the checkpoint needs the image again. So each image directory
// holds:
//
//	checkpoint.img, pages_meta.img, pages.img   what the sentry wrote
//	image.json      {"id": its own id, "bases": [ids of the images it references]}
//	base-<id>.img   each of those images' pages file
//	pages-working-set.txt   the pages the first restore of it wrote first,
//	                which later restores load up front (written by runsc
//	                and the sentry, patches/gvisor: working-set)
//
// which `runsc restore` (patched) passes to the sentry. A base is a hard
// link to the pages file it names when they share a filesystem (it costs
// nothing and keeps the pages whoever deletes the other directory), else a
// copy. In an image on tmpfs (fork's, used at once and deleted) it is a
// symbolic link to a file descriptor the runtime holds until the directory
// is gone (the sentry hands them out with the checkpoint), so a fork never
// copies pages from disk into memory.

// metaImageID is the checkpoint metadata key of an image's id
// (pgalloc.ImageIDKey in the patched gVisor).
const metaImageID = "cellfork_image_id"

// imageManifest is image.json.
type imageManifest struct {
	ID    string   `json:"id"`
	Bases []string `json:"bases"`
}

func newImageID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// validImageID accepts the ids newImageID makes (and the sentry's own for
// images that did not name themselves): a file name, nothing more.
func validImageID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == '-') {
			return false
		}
	}
	return true
}

// heldBases are file descriptors of the bases of images on tmpfs, held
// until the image's directory is deleted. Each is tracked by an open
// descriptor of the directory, which survives renames (checkpoints are
// written beside their final name and renamed into place) and reports the
// directory's removal (no links left). Safe for concurrent use.
type heldBases struct {
	mu   sync.Mutex
	held []heldImage
}

type heldImage struct {
	dir   *os.File
	files []*os.File
}

// hold keeps files until dir is deleted.
func (h *heldBases) hold(dir string, files []*os.File) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweepLocked()
	h.held = append(h.held, heldImage{dir: d, files: files})
	return nil
}

// sweep closes the descriptors of images whose directory is gone.
func (h *heldBases) sweep() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweepLocked()
}

func (h *heldBases) sweepLocked() {
	kept := h.held[:0]
	for _, im := range h.held {
		var st unix.Stat_t
		if err := unix.Fstat(int(im.dir.Fd()), &st); err == nil && st.Nlink > 0 {
			kept = append(kept, im)
			continue
		}
		closeAll(im.files)
		im.dir.Close()
	}
	h.held = kept
}

// keepBases writes image.json into dir, a checkpoint the sentry just wrote
// as imageID, and puts its bases beside it: ids[i] is a read-only
// descriptor of base i, which keepBases takes over (dups what it keeps).
func (r *Runtime) keepBases(dir, imageID string, ids []string, files []*os.File) error {
	for _, id := range ids {
		if !validImageID(id) {
			return fmt.Errorf("checkpoint in %s references an image named %q", dir, id)
		}
	}
	tmpfs := onTmpfs(dir)
	var held []*os.File
	for i, id := range ids {
		dst := filepath.Join(dir, "base-"+id+".img")
		if tmpfs {
			fd, err := unix.Dup(int(files[i].Fd()))
			if err != nil {
				closeAll(held)
				return err
			}
			unix.CloseOnExec(fd)
			f := os.NewFile(uintptr(fd), dst)
			held = append(held, f)
			if err := os.Symlink("/proc/"+strconv.Itoa(os.Getpid())+"/fd/"+strconv.Itoa(fd), dst); err != nil {
				closeAll(held)
				return err
			}
			continue
		}
		if err := linkOrCopy(files[i], dst); err != nil {
			return fmt.Errorf("keeping base image %s of %s: %w", id, dir, err)
		}
	}
	b, _ := json.Marshal(imageManifest{ID: imageID, Bases: append([]string{}, ids...)})
	if err := os.WriteFile(filepath.Join(dir, "image.json"), b, 0o644); err != nil {
		closeAll(held)
		return err
	}
	if len(held) > 0 {
		if err := r.bases.hold(dir, held); err != nil {
			closeAll(held)
			return err
		}
	}
	return nil
}

// linkOrCopy makes dst the file f is open on: a hard link if f still has a
// name on dst's filesystem, else a copy of its contents.
func linkOrCopy(f *os.File, dst string) error {
	err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.AT_FDCWD, dst, unix.AT_SYMLINK_FOLLOW)
	if err == nil {
		return nil
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, io.NewSectionReader(f, 0, 1<<62)); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func onTmpfs(dir string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(dir, &fs) == nil && fs.Type == unix.TMPFS_MAGIC
}
