package envd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/agent"
	"github.com/cellfork/cellfork/internal/envd/filesystem"
)

// fsService implements filesystem.Filesystem. Operations run as root on
// behalf of the caller's user, who owns what they create (as upstream envd).
// Safe for concurrent use.
type fsService struct {
	settings *agent.Settings
	watchers *watcherRegistry
}

func newFSService(s *agent.Settings) *fsService {
	return &fsService{settings: s, watchers: newWatcherRegistry()}
}

// resolve returns the caller's account and the resolved form of path.
func (s *fsService) resolve(h http.Header, path string) (agent.Account, string, error) {
	acc, err := requestAccount(s.settings, h)
	if err != nil {
		return agent.Account{}, "", err
	}
	p, err := resolvePath(path, acc, s.settings.Workdir())
	return acc, p, err
}

// Stat describes one path.
func (s *fsService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, connectError("Stat", err)
	}
	entry, err := statEntry(path, newIDNames())
	if err != nil {
		return nil, connectError("Stat", err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entry}), nil
}

// ListDir lists a directory down to depth levels (0 means 1). Symlinks in
// the tree are reported, not followed; entry paths are under the requested
// path even when it is a symlink.
func (s *fsService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, connectError("ListDir", err)
	}
	entries, err := listDir(ctx, path, max(int(req.Msg.GetDepth()), 1))
	if err != nil {
		return nil, connectError("ListDir", err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: entries}), nil
}

func listDir(ctx context.Context, path string, depth int) ([]*filesystem.EntryInfo, error) {
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil, notFoundf("directory not found: %s", path)
		}
		return nil, fmt.Errorf("resolving %s: %w", path, err)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("stating %s: %w", root, err)
	}
	if !fi.IsDir() {
		return nil, invalidf("path is not a directory: %s", path)
	}
	names := newIDNames()
	entries := []*filesystem.EntryInfo{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if p == root {
			return err
		}
		if err != nil {
			return nil // an unreadable subtree is skipped, not fatal
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return nil // removed while listing
		}
		entries = append(entries, entryFromInfo(filepath.Join(path, rel), info, names))
		if d.IsDir() && strings.Count(rel, string(filepath.Separator))+1 >= depth {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", path, err)
	}
	return entries, nil
}

// MakeDir creates a directory and its missing parents.
func (s *fsService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	acc, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, connectError("MakeDir", err)
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return nil, connectError("MakeDir", newErr(kindExists, "directory already exists: %s", path))
		}
		return nil, connectError("MakeDir", invalidf("path already exists and is not a directory: %s", path))
	}
	if err := ensureDirs(path, acc); err != nil {
		return nil, connectError("MakeDir", err)
	}
	entry, err := statEntry(path, newIDNames())
	if err != nil {
		return nil, connectError("MakeDir", err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entry}), nil
}

// Move renames source to destination, creating the destination's parents.
// Across filesystems, regular files and symlinks are copied then removed.
func (s *fsService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	acc, src, err := s.resolve(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, connectError("Move", err)
	}
	dst, err := resolvePath(req.Msg.GetDestination(), acc, s.settings.Workdir())
	if err == nil {
		err = move(src, dst, acc)
	}
	if err != nil {
		return nil, connectError("Move", err)
	}
	entry, err := statEntry(dst, newIDNames())
	if err != nil {
		return nil, connectError("Move", err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entry}), nil
}

func move(src, dst string, acc agent.Account) error {
	if _, err := os.Lstat(src); err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return notFoundf("source not found: %s", src)
		}
		return fmt.Errorf("stating %s: %w", src, err)
	}
	if err := ensureDirs(filepath.Dir(dst), acc); err != nil {
		return err
	}
	err := os.Rename(src, dst)
	if errors.Is(err, syscall.EXDEV) {
		err = copyAcross(src, dst)
	}
	if err != nil {
		return fmt.Errorf("moving %s to %s: %w", src, dst, err)
	}
	return nil
}

// copyAcross moves a regular file or symlink to another filesystem.
func copyAcross(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
	case fi.Mode().IsRegular():
		if err := copyFile(src, dst, fi); err != nil {
			return err
		}
	default:
		return preconditionf("cannot move %s to another filesystem: only files and symlinks can be", src)
	}
	return os.Remove(src)
}

func copyFile(src, dst string, fi fs.FileInfo) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		_ = os.Remove(dst)
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		_ = out.Chown(int(st.Uid), int(st.Gid))
	}
	return out.Close()
}

// Remove deletes a file or a directory tree; removing what does not exist
// succeeds.
func (s *fsService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, connectError("Remove", err)
	}
	if path == "/" {
		return nil, connectError("Remove", invalidf("refusing to remove /"))
	}
	// A path that does not exist is already removed: success, as upstream
	// (os.RemoveAll).
	if err := os.RemoveAll(path); err != nil && !errors.Is(err, syscall.ENOTDIR) {
		return nil, connectError("Remove", fmt.Errorf("removing %s: %w", path, err))
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}
