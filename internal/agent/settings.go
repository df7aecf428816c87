// Package agent is the in-sandbox side of cellfork: it serves the envd
// process/filesystem services and /files on one port and the code
// interpreter on another. The daemon is the only client; it authenticates
// callers at the edge, so the agent trusts every request it receives.
//
// This package must not import daemon, runtime or store code (checked by
// cmd/cellfork-agent/deps_test.go).
package agent

import (
	"fmt"
	"maps"
	"os/user"
	"strconv"
	"strings"
	"sync"
)

// ValidEnvName reports whether name can be passed to execve (and Python's
// os.environ) as a variable name: not empty, no '=' and no NUL byte.
func ValidEnvName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "=\x00")
}

// DefaultUser is the user that commands, files and run_code use when the
// caller names none, as in E2B.
const DefaultUser = "user"

// Settings are the per-sandbox defaults set by the daemon through POST /init
// (environment variables, default user and working directory). Safe for
// concurrent use.
type Settings struct {
	mu        sync.RWMutex
	user      string
	workdir   string
	envs      map[string]string
	maxUpload int64 // 0: the agent's default
}

// NewSettings returns settings with the E2B defaults: user `user`, no extra
// environment variables, workdir = that user's home.
func NewSettings() *Settings {
	return &Settings{user: DefaultUser, envs: map[string]string{}}
}

// Init replaces the defaults. Empty user or workdir keeps the current value;
// envs are merged over the current ones.
func (s *Settings) Init(defaultUser, workdir string, envs map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if defaultUser != "" {
		s.user = defaultUser
	}
	if workdir != "" {
		s.workdir = workdir
	}
	maps.Copy(s.envs, envs)
}

// SetMaxUpload sets the largest upload accepted, in bytes (0 keeps the
// agent's default). It comes through /init, not the boot environment: a
// sandbox restored from a snapshot was booted by another daemon.
func (s *Settings) SetMaxUpload(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxUpload = n
}

// MaxUpload returns the upload limit set by SetMaxUpload, or 0.
func (s *Settings) MaxUpload() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.maxUpload
}

// User returns the default user name.
func (s *Settings) User() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.user
}

// Workdir returns the default working directory ("" means the user's home).
func (s *Settings) Workdir() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.workdir
}

// Envs returns a copy of the sandbox-wide environment variables.
func (s *Settings) Envs() map[string]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return maps.Clone(s.envs)
}

// Account is a resolved local user.
type Account struct {
	Name string
	UID  uint32
	GID  uint32
	Home string
}

// LookupAccount resolves a user name from /etc/passwd. An unknown user is an
// error whose message is meant for the caller.
func LookupAccount(name string) (Account, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return Account{}, fmt.Errorf("unknown user %q", name)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return Account{}, fmt.Errorf("user %q has a non-numeric uid/gid", name)
	}
	return Account{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}, nil
}
