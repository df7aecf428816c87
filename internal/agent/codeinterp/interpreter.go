// Package codeinterp is the agent's code interpreter: the E2B
// code-interpreter API (POST /execute, /contexts, /health on port 49999)
// served by one long-lived Python process per code context, running
// kernel.py. State persists between executions in a context; executions in
// one context are serialized, different contexts run in parallel.
package codeinterp

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/agent"
)

// Environment variables of the agent process that the interpreter reads.
const (
	// PythonEnv names the Python binary (default: python3 on PATH, else
	// /usr/bin/python3).
	PythonEnv = "CELLFORK_PYTHON"
	// PreimportEnv is a comma-separated list of modules every kernel imports
	// before it takes commands. Passed on to kernels; sandbox-wide variables
	// (Settings.Envs) may set it too.
	PreimportEnv = "CELLFORK_PREIMPORT"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Interpreter serves the code-interpreter API. Safe for concurrent use.
type Interpreter struct {
	settings   *agent.Settings
	kernelPath string
	python     string
	log        *slog.Logger
	timing     timing
	startWait  time.Duration // until a new kernel must be ready

	mu        sync.Mutex
	contexts  map[string]*codeContext
	defaultID string // "" until the default context exists
	seq       uint64
	closed    bool
}

// New returns an interpreter whose kernels run kernelPath (kernel.py) as
// the settings' default user. Nothing starts until StartDefault or the
// first request.
func New(s *agent.Settings, kernelPath string) *Interpreter {
	return &Interpreter{
		settings:   s,
		kernelPath: kernelPath,
		python:     findPython(),
		log:        slog.Default().With("component", "codeinterp"),
		timing:     timing{keepalive: 5 * time.Second, grace: 3 * time.Second, interrupts: 3},
		startWait:  2 * time.Minute,
		contexts:   map[string]*codeContext{},
	}
}

func findPython() string {
	if p := os.Getenv(PythonEnv); p != "" {
		return p
	}
	if p, err := exec.LookPath("python3"); err == nil {
		return p
	}
	return "/usr/bin/python3"
}

// StartDefault starts the default python context's kernel and waits until
// it is ready, so the first run_code does not pay for it.
func (i *Interpreter) StartDefault() error {
	c, err := i.defaultContext()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), i.startWait)
	defer cancel()
	if _, err := c.kernel(ctx, i.spawnSpec); err != nil {
		return fmt.Errorf("starting the default context: %w", err)
	}
	return nil
}

// Close kills every kernel. Later requests fail with 503.
func (i *Interpreter) Close() {
	i.mu.Lock()
	i.closed = true
	all := slices.Collect(maps.Values(i.contexts))
	clear(i.contexts)
	i.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range all {
		wg.Go(c.remove)
	}
	wg.Wait()
}

// defaultContext returns the default context, creating it (without a
// kernel) in the default user's home if needed.
func (i *Interpreter) defaultContext() (*codeContext, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return nil, errClosed
	}
	if c, ok := i.contexts[i.defaultID]; ok {
		return c, nil
	}
	acct, err := agent.LookupAccount(i.settings.User())
	if err != nil {
		return nil, fmt.Errorf("creating the default context: %w", err)
	}
	c := i.addLocked(acct.Home)
	i.defaultID = c.id
	return c, nil
}

func (i *Interpreter) addLocked(cwd string) *codeContext {
	i.seq++
	c := newCodeContext(newID(), cwd, i.seq)
	i.contexts[c.id] = c
	return c
}

// create adds a context and starts its kernel.
func (i *Interpreter) create(ctx context.Context, cwd string) (*codeContext, error) {
	if cwd == "" {
		acct, err := agent.LookupAccount(i.settings.User())
		if err != nil {
			return nil, err
		}
		cwd = acct.Home
	} else if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("cwd %q is not a directory: %w", cwd, errInvalid)
	}
	i.mu.Lock()
	if i.closed {
		i.mu.Unlock()
		return nil, errClosed
	}
	c := i.addLocked(cwd)
	i.mu.Unlock()
	if _, err := c.kernel(ctx, i.spawnSpec); err != nil {
		i.remove(c.id)
		return nil, fmt.Errorf("creating context: %w", err)
	}
	return c, nil
}

func (i *Interpreter) lookup(id string) (*codeContext, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return nil, errClosed
	}
	c, ok := i.contexts[id]
	if !ok {
		return nil, fmt.Errorf("context %s: %w", id, errNotFound)
	}
	return c, nil
}

// list returns the default context, then the others in creation order.
func (i *Interpreter) list() ([]contextInfo, error) {
	def, err := i.defaultContext()
	if err != nil {
		return nil, err
	}
	i.mu.Lock()
	all := slices.Collect(maps.Values(i.contexts))
	i.mu.Unlock()
	slices.SortFunc(all, func(a, b *codeContext) int {
		switch {
		case a == def:
			return -1
		case b == def:
			return 1
		}
		return cmp.Compare(a.seq, b.seq)
	})
	infos := make([]contextInfo, len(all))
	for n, c := range all {
		infos[n] = c.info()
	}
	return infos, nil
}

func (i *Interpreter) remove(id string) error {
	i.mu.Lock()
	c, ok := i.contexts[id]
	delete(i.contexts, id)
	i.mu.Unlock()
	if !ok {
		return fmt.Errorf("context %s: %w", id, errNotFound)
	}
	c.remove()
	return nil
}

// spawnSpec describes a kernel for a context in cwd, as the current default
// user with the current sandbox-wide environment.
func (i *Interpreter) spawnSpec(id, cwd string) (spawnSpec, error) {
	acct, err := agent.LookupAccount(i.settings.User())
	if err != nil {
		return spawnSpec{}, err
	}
	base := i.settings.Envs()
	env := map[string]string{
		"PATH": defaultPath, "HOME": acct.Home, "USER": acct.Name, "LOGNAME": acct.Name,
		"SHELL": "/bin/bash", "LANG": "C.UTF-8", "PWD": cwd,
		"PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg",
	}
	if v := os.Getenv(PreimportEnv); v != "" {
		env[PreimportEnv] = v
	}
	maps.Copy(env, base)
	list := make([]string, 0, len(env))
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	return spawnSpec{
		python: i.python, script: i.kernelPath, cwd: cwd, env: list,
		cred: credential(acct), baseEnv: base, timeout: i.startWait,
		log: i.log.With("context.id", id),
	}, nil
}

// credential returns the credential to run as acct, or nil when that is
// the agent's own user.
func credential(acct agent.Account) *syscall.Credential {
	if int(acct.UID) == os.Geteuid() && int(acct.GID) == os.Getegid() {
		return nil
	}
	cred := &syscall.Credential{Uid: acct.UID, Gid: acct.GID, Groups: []uint32{}}
	if u, err := user.Lookup(acct.Name); err == nil {
		if gids, err := u.GroupIds(); err == nil {
			for _, g := range gids {
				if n, err := strconv.ParseUint(g, 10, 32); err == nil {
					cred.Groups = append(cred.Groups, uint32(n))
				}
			}
		}
	}
	return cred
}

// checkLanguage accepts the languages this interpreter runs.
func checkLanguage(lang string) error {
	switch strings.ToLower(strings.TrimSpace(lang)) {
	case "", "python", "python3":
		return nil
	}
	return fmt.Errorf("language %q is not supported, only python is: %w", lang, errInvalid)
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// Error classes, mapped to HTTP status in writeError.
var (
	errInvalid  = errors.New("invalid argument")
	errNotFound = errors.New("not found")
	errClosed   = errors.New("the code interpreter is shutting down")
)
