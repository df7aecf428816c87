// Package codeinterp is the agent's code interpreter: the E2B
// code-interpreter API (POST /execute, /contexts, /health on port 49999)
// served by one long-lived kernel process per code context: kernel.py for
// Python, node (kernel.js) for JavaScript and TypeScript, Rscript
// (kernel.R), a JVM with JShell (kernel.java) and bash (kernel.sh). State
// persists between executions in a context; executions in one context are
// serialized, different contexts run in parallel. A kernel starts when its
// context is first created or used, so a sandbox pays only for the
// languages it runs.
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

// DefaultCacheDir holds what the interpreter prepares once per sandbox
// (the compiled Java kernel).
const DefaultCacheDir = "/var/cache/cellfork"

// Interpreter serves the code-interpreter API. Safe for concurrent use.
type Interpreter struct {
	settings  *agent.Settings
	kernelDir string // kernel.py and the other kernels (kernelFile)
	python    string
	cacheDir  string
	log       *slog.Logger
	timing    timing
	startWait time.Duration // until a new kernel must be ready
	java      javaCache

	mu       sync.Mutex
	contexts map[string]*codeContext
	defaults map[string]string // language -> id of its default context
	seq      uint64
	closed   bool
}

// New returns an interpreter whose kernels run the kernel files in
// kernelDir (kernelFile) as the settings' default user. Nothing starts until
// StartDefault or the first request.
func New(s *agent.Settings, kernelDir string) *Interpreter {
	return &Interpreter{
		settings:  s,
		kernelDir: kernelDir,
		python:    findPython(),
		cacheDir:  DefaultCacheDir,
		log:       slog.Default().With("component", "codeinterp"),
		timing:    timing{keepalive: 5 * time.Second, grace: 3 * time.Second, interrupts: 3},
		startWait: 2 * time.Minute,
		contexts:  map[string]*codeContext{},
		defaults:  map[string]string{},
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
	c, err := i.defaultContext(Python)
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

// defaultContext returns lang's default context, creating it (without a
// kernel) in the default user's home if needed. The first call creates the
// default contexts of defaultLanguages too, so that they head the list.
func (i *Interpreter) defaultContext(lang string) (*codeContext, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return nil, errClosed
	}
	if c, ok := i.contexts[i.defaults[lang]]; ok {
		return c, nil
	}
	acct, err := agent.LookupAccount(i.settings.User())
	if err != nil {
		return nil, fmt.Errorf("creating the default context: %w", err)
	}
	langs := []string{lang}
	if len(i.defaults) == 0 {
		langs = append(slices.Clone(defaultLanguages), lang)
	}
	for _, l := range langs {
		if _, ok := i.contexts[i.defaults[l]]; !ok {
			i.defaults[l] = i.addLocked(l, acct.Home).id
		}
	}
	return i.contexts[i.defaults[lang]], nil
}

func (i *Interpreter) addLocked(lang, cwd string) *codeContext {
	i.seq++
	c := newCodeContext(newID(), lang, cwd, i.seq)
	i.contexts[c.id] = c
	return c
}

// create adds a context of lang and starts its kernel.
func (i *Interpreter) create(ctx context.Context, lang, cwd string) (*codeContext, error) {
	// The default contexts exist from the start, as in E2B (only their
	// records: no kernel), so they head the list.
	if _, err := i.defaultContext(Python); err != nil {
		return nil, err
	}
	acct, err := agent.LookupAccount(i.settings.User())
	if err != nil {
		return nil, err
	}
	if cwd == "" {
		cwd = acct.Home
	} else if cwd, err = checkCwd(acct, cwd); err != nil {
		return nil, err
	}
	i.mu.Lock()
	if i.closed {
		i.mu.Unlock()
		return nil, errClosed
	}
	c := i.addLocked(lang, cwd)
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

// list returns the contexts in creation order: the default python and
// javascript contexts first, as E2B lists them.
func (i *Interpreter) list() ([]contextInfo, error) {
	if _, err := i.defaultContext(Python); err != nil {
		return nil, err
	}
	i.mu.Lock()
	all := slices.Collect(maps.Values(i.contexts))
	i.mu.Unlock()
	slices.SortFunc(all, func(a, b *codeContext) int { return cmp.Compare(a.seq, b.seq) })
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

// spawnSpec describes a kernel for context c, as the current default user
// with the current sandbox-wide environment.
func (i *Interpreter) spawnSpec(ctx context.Context, c *codeContext) (spawnSpec, error) {
	acct, err := agent.LookupAccount(i.settings.User())
	if err != nil {
		return spawnSpec{}, err
	}
	argv, err := i.argv(ctx, c.language)
	if err != nil {
		return spawnSpec{}, err
	}
	base := i.settings.Envs()
	env := map[string]string{
		"PATH": defaultPath, "HOME": acct.Home, "USER": acct.Name, "LOGNAME": acct.Name,
		"SHELL": "/bin/bash", "LANG": "C.UTF-8", "PWD": c.cwd,
	}
	spec := spawnSpec{
		argv: argv, cwd: c.cwd, cred: credential(acct), baseEnv: base, timeout: i.startWait,
		log: i.log.With("context.id", c.id, "context.language", c.language),
	}
	if c.language == Python {
		env["PYTHONUNBUFFERED"], env["MPLBACKEND"] = "1", "Agg"
		if v := os.Getenv(PreimportEnv); v != "" {
			env[PreimportEnv] = v
		}
	} else {
		spec.foreign, spec.mark = true, newMark()
	}
	maps.Copy(env, base)
	if spec.foreign {
		env["CELLFORK_MARK"] = spec.mark
	}
	for k, v := range env {
		spec.env = append(spec.env, k+"="+v)
	}
	return spec, nil
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

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// Error classes, mapped to HTTP status in writeError.
var (
	errInvalid     = errors.New("invalid argument")
	errNotFound    = errors.New("not found")
	errClosed      = errors.New("the code interpreter is shutting down")
	errUnavailable = errors.New("not available in this sandbox")
)
