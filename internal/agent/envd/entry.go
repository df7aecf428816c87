package envd

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cellfork/cellfork/internal/envd/filesystem"
)

// metadataXattrPrefix namespaces the user metadata of files, as in upstream
// envd (`X-Metadata-<key>` on upload, EntryInfo.metadata on reads).
const metadataXattrPrefix = "user.e2b."

// idNames caches uid/gid -> name lookups for one request. Not safe for
// concurrent use.
type idNames struct {
	users  map[uint32]string
	groups map[uint32]string
}

func newIDNames() *idNames {
	return &idNames{users: map[uint32]string{}, groups: map[uint32]string{}}
}

func (n *idNames) user(uid uint32) string {
	if name, ok := n.users[uid]; ok {
		return name
	}
	name := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(name); err == nil {
		name = u.Username
	}
	n.users[uid] = name
	return name
}

func (n *idNames) group(gid uint32) string {
	if name, ok := n.groups[gid]; ok {
		return name
	}
	name := strconv.FormatUint(uint64(gid), 10)
	if g, err := user.LookupGroupId(name); err == nil {
		name = g.Name
	}
	n.groups[gid] = name
	return name
}

// statEntry describes the file at path without following a final symlink.
func statEntry(path string, names *idNames) (*filesystem.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil, notFoundf("path not found: %s", path)
		}
		return nil, fmt.Errorf("stating %s: %w", path, err)
	}
	return entryFromInfo(path, fi, names), nil
}

// entryFromInfo builds the EntryInfo of path from its lstat result. For a
// symlink, type and mode describe the target and isSymlink marks the link,
// as newer envd does.
func entryFromInfo(path string, fi fs.FileInfo, names *idNames) *filesystem.EntryInfo {
	mode := fi.Mode()
	e := &filesystem.EntryInfo{
		Name:         fi.Name(),
		Type:         fileType(mode),
		Path:         path,
		Size:         fi.Size(),
		Mode:         uint32(mode.Perm()),
		Permissions:  mode.String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = names.user(st.Uid)
		e.Group = names.group(st.Gid)
	}
	if mode&fs.ModeSymlink != 0 {
		e.IsSymlink = true
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			target, _ = os.Readlink(path)
		}
		e.SymlinkTarget = &target
		e.Type, e.Mode = filesystem.FileType_FILE_TYPE_UNSPECIFIED, 0
		if ti, err := os.Stat(path); err == nil {
			e.Type, e.Mode = fileType(ti.Mode()), uint32(ti.Mode().Perm())
		}
	}
	e.Metadata = readMetadata(path)
	return e
}

func fileType(m fs.FileMode) filesystem.FileType {
	switch {
	case m.IsRegular():
		return filesystem.FileType_FILE_TYPE_FILE
	case m.IsDir():
		return filesystem.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		return filesystem.FileType_FILE_TYPE_SYMLINK
	}
	return filesystem.FileType_FILE_TYPE_UNSPECIFIED
}

// readMetadata returns the user.e2b.* xattrs of path (following symlinks),
// or nil when there are none or the filesystem has no xattrs.
func readMetadata(path string) map[string]string {
	size, err := unix.Listxattr(path, nil)
	if err != nil || size <= 0 {
		return nil
	}
	buf := make([]byte, size)
	size, err = unix.Listxattr(path, buf)
	if err != nil {
		return nil
	}
	var md map[string]string
	for name := range bytes.SplitSeq(buf[:size], []byte{0}) {
		key, ok := strings.CutPrefix(string(name), metadataXattrPrefix)
		if !ok || key == "" {
			continue
		}
		if v, ok := getXattr(path, string(name)); ok {
			if md == nil {
				md = map[string]string{}
			}
			md[key] = v
		}
	}
	return md
}

func getXattr(path, name string) (string, bool) {
	n, err := unix.Getxattr(path, name, nil)
	if err != nil {
		return "", false
	}
	buf := make([]byte, n)
	n, err = unix.Getxattr(path, name, buf)
	if err != nil {
		return "", false
	}
	return string(buf[:n]), true
}
