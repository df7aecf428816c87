package envd

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/cellfork/cellfork/internal/agent"
)

// maxPathLen is Linux's PATH_MAX; longer paths can never name a file.
const maxPathLen = 4096

// defaultPath is the PATH processes get when the agent itself has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// usernameFromHeader returns the user named by `Authorization: Basic
// base64("name:")`, or "" when the header is absent.
func usernameFromHeader(h http.Header) (string, error) {
	v := h.Get("Authorization")
	if v == "" {
		return "", nil
	}
	r := http.Request{Header: http.Header{"Authorization": {v}}}
	name, _, ok := r.BasicAuth()
	if !ok {
		return "", newErr(kindUnauthenticated, `malformed Authorization header: want Basic base64("<user>:")`)
	}
	return name, nil
}

// lookupAccount resolves name, or the default user when name is empty. An
// unknown user is unauthenticated, as in upstream envd.
func lookupAccount(s *agent.Settings, name string) (agent.Account, error) {
	if name == "" {
		name = s.User()
	}
	if strings.IndexByte(name, 0) >= 0 {
		return agent.Account{}, newErr(kindUnauthenticated, "invalid username %q", name)
	}
	acc, err := agent.LookupAccount(name)
	if err != nil {
		// Upstream envd's wording, which E2B's template tests match.
		return agent.Account{}, newErr(kindUnauthenticated, "invalid username: '%s'", name)
	}
	return acc, nil
}

// resolvePath turns a caller-supplied path into an absolute, clean path,
// as upstream envd does: "" is the default workdir (or home), "~" and "~/x"
// expand to the home directory, and any other relative path is relative
// to the home directory (not to the workdir, as upstream). ".." is resolved
// lexically. Paths with a NUL byte, longer than PATH_MAX, or naming another
// user's home ("~other") are invalid_argument.
func resolvePath(p string, acc agent.Account, workdir string) (string, error) {
	home := acc.Home
	if !filepath.IsAbs(home) {
		home = "/" + home
	}
	switch {
	case p == "" && workdir != "":
		p = workdir
	case p == "":
		p = home
	case p == "~" || strings.HasPrefix(p, "~/"):
		p = home + p[1:]
	case p[0] == '~':
		return "", invalidf("invalid path %q: cannot expand another user's home directory", p)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", invalidf("invalid path %q: contains a NUL byte", p)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(home, p)
	}
	if len(p) > maxPathLen {
		return "", invalidf("invalid path: longer than %d bytes", maxPathLen)
	}
	return filepath.Clean(p), nil
}

// ensureDirs creates the missing directories of dir (mode 0755) and gives
// the ones it creates to acc, like `mkdir -p` run by that user.
func ensureDirs(dir string, acc agent.Account) error {
	var missing []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			if !fi.IsDir() {
				return invalidf("path %s is not a directory", d)
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return fmt.Errorf("checking directory %s: %w", d, err)
		}
		missing = append(missing, d)
		if d == "/" {
			break
		}
	}
	for _, d := range slices.Backward(missing) {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("creating directory %s: %w", d, err)
		}
		if err := os.Lchown(d, int(acc.UID), int(acc.GID)); err != nil {
			return fmt.Errorf("changing owner of %s: %w", d, err)
		}
	}
	return nil
}

// supplementaryGroups returns acc's groups from /etc/group (best effort).
func supplementaryGroups(acc agent.Account) []uint32 {
	groups := []uint32{acc.GID}
	u, err := user.Lookup(acc.Name)
	if err != nil {
		return groups
	}
	ids, err := u.GroupIds()
	if err != nil {
		return groups
	}
	for _, id := range ids {
		if g, err := strconv.ParseUint(id, 10, 32); err == nil && !slices.Contains(groups, uint32(g)) {
			groups = append(groups, uint32(g))
		}
	}
	return groups
}

// buildEnv returns the environment of a process run as acc: PATH, HOME,
// USER and LOGNAME, then the sandbox-wide variables, then the request's
// variables (later sources win). Output is sorted for determinism.
func buildEnv(acc agent.Account, global, request map[string]string) ([]string, error) {
	path := os.Getenv("PATH")
	if path == "" {
		path = defaultPath
	}
	env := map[string]string{"PATH": path, "HOME": acc.Home, "USER": acc.Name, "LOGNAME": acc.Name}
	for k, v := range global {
		if agent.ValidEnvName(k) && strings.IndexByte(v, 0) < 0 {
			env[k] = v
		}
	}
	for k, v := range request {
		if !agent.ValidEnvName(k) {
			return nil, invalidf("invalid environment variable name %q", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, invalidf("environment variable %s contains a NUL byte", k)
		}
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out, nil
}

// lookPath finds an executable the way a shell with the given PATH would.
func lookPath(name, pathEnv string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", invalidf("executable %q not found in PATH", name)
}

// envValue returns the value of key in a KEY=VALUE list.
func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}
