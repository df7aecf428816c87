package codeinterp

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/cellfork/cellfork/internal/agent"
)

// checkCwd resolves a context's working directory for acct, who runs its
// kernel: a relative path is taken from acct's home (as envd takes relative
// paths), and the directory must exist and be searchable by acct along the
// whole path. The agent runs as root, so this is checked from the modes,
// not by trying. It returns the absolute, cleaned path.
func checkCwd(acct agent.Account, cwd string) (string, error) {
	if strings.IndexByte(cwd, 0) >= 0 {
		return "", fmt.Errorf("cwd %q holds a NUL byte: %w", cwd, errInvalid)
	}
	if !filepath.IsAbs(cwd) {
		cwd = filepath.Join(acct.Home, cwd)
	}
	cwd = filepath.Clean(cwd)
	real, err := filepath.EvalSymlinks(cwd)
	if err != nil {
		return "", fmt.Errorf("cwd %q does not exist: %w", cwd, errInvalid)
	}
	if st, err := os.Stat(real); err != nil || !st.IsDir() {
		return "", fmt.Errorf("cwd %q is not a directory: %w", cwd, errInvalid)
	}
	if acct.UID == 0 {
		return cwd, nil
	}
	groups := []uint32{acct.GID}
	if cred := credential(acct); cred != nil {
		groups = append(groups, cred.Groups...)
	}
	for dir := real; ; dir = filepath.Dir(dir) {
		var st syscall.Stat_t
		if err := syscall.Stat(dir, &st); err != nil {
			return "", fmt.Errorf("cwd %q: %w", cwd, errInvalid)
		}
		if !searchable(st, acct.UID, groups) {
			return "", fmt.Errorf("cwd %q: permission denied: code contexts run as user %q, who cannot enter %s "+
				"(E2B's run as root; give a directory %s can use, such as its home %s): %w",
				cwd, acct.Name, dir, acct.Name, acct.Home, errInvalid)
		}
		if dir == "/" {
			return cwd, nil
		}
	}
}

// searchable reports whether a user may pass through a directory with
// this stat (the x permission that applies to the user).
func searchable(st syscall.Stat_t, uid uint32, groups []uint32) bool {
	mode := st.Mode
	switch {
	case st.Uid == uid:
		return mode&0o100 != 0
	case slices.Contains(groups, st.Gid):
		return mode&0o010 != 0
	default:
		return mode&0o001 != 0
	}
}
