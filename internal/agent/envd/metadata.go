package envd

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Limits of file metadata, as upstream envd's: an xattr name is at most
// 255 bytes, and ext4 keeps a file's xattrs in one 4 KiB block.
const (
	maxMetadataKeyLen   = 255 - len(metadataXattrPrefix)
	maxMetadataTotalLen = 4096
)

// validateMetadata refuses metadata that could not be stored: empty or
// overlong keys, bytes outside printable ASCII (what an X-Metadata-* header
// may carry), or more than maxMetadataTotalLen in all.
func validateMetadata(md map[string]string) error {
	total := 0
	for k, v := range md {
		switch {
		case k == "":
			return invalidf("invalid metadata: empty key")
		case len(k) > maxMetadataKeyLen:
			return invalidf("invalid metadata: key %q is longer than %d bytes", k, maxMetadataKeyLen)
		case !printableASCII(k):
			return invalidf("invalid metadata: key %q is not printable ASCII", k)
		case !printableASCII(v):
			return invalidf("invalid metadata: the value of %q is not printable ASCII", k)
		}
		total += len(metadataXattrPrefix) + len(k) + len(v)
	}
	if total > maxMetadataTotalLen {
		return invalidf("invalid metadata: %d bytes in all, more than %d", total, maxMetadataTotalLen)
	}
	return nil
}

func printableASCII(s string) bool {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// replaceMetadata makes md the whole metadata of the open file f: user.e2b.*
// xattrs not in md are removed (an overwrite keeps a file's xattrs, and
// stale metadata must not survive it), those in md are set. Nothing is
// touched when there is nothing to change, so an upload without metadata
// causes no extra inotify events. A filesystem without user xattrs is not
// an error: metadata is best effort there, and what was stored is read back.
func replaceMetadata(f *os.File, md map[string]string) error {
	fd := int(f.Fd())
	names, err := listXattrs(fd)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		return fmt.Errorf("listing metadata of %s: %w", f.Name(), err)
	}
	for _, name := range names {
		key, ok := strings.CutPrefix(name, metadataXattrPrefix)
		if !ok {
			continue
		}
		if _, keep := md[key]; keep {
			continue
		}
		if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("clearing metadata %q of %s: %w", key, f.Name(), err)
		}
	}
	for k, v := range md {
		if err := unix.Fsetxattr(fd, metadataXattrPrefix+k, []byte(v), 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) {
				return nil
			}
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.E2BIG) {
				return newErr(kindNoSpace, "no space for the metadata of %s: %v", f.Name(), err)
			}
			return fmt.Errorf("setting metadata %q of %s: %w", k, f.Name(), err)
		}
	}
	return nil
}

// listXattrs returns the xattr names of an open file.
func listXattrs(fd int) ([]string, error) {
	for {
		size, err := unix.Flistxattr(fd, nil)
		if err != nil || size == 0 {
			return nil, err
		}
		buf := make([]byte, size)
		n, err := unix.Flistxattr(fd, buf)
		if errors.Is(err, unix.ERANGE) {
			continue // grew in between
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for name := range bytes.SplitSeq(buf[:n], []byte{0}) {
			if len(name) > 0 {
				names = append(names, string(name))
			}
		}
		return names, nil
	}
}
