// Package template resolves template ids to root filesystems, builds the
// built-in ones on demand (debootstrap, cached under the hash of their
// definition) and installs the in-sandbox agent into them.
package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/templates"
)

// aliases maps the template ids the E2B SDKs use by default to ours.
var aliases = map[string]string{
	"base":                "base",
	"code-interpreter-v1": "base",
	"code-interpreter":    "base",
}

// AgentFiles are the files installed into every rootfs under /opt/cellfork:
// the agent and its code interpreter's kernels.
var AgentFiles = []string{"cellfork-agent", "kernel.py", "kernel_rich.py", "kernel.js", "kernel.R", "kernel.java", "kernel.sh"}

// AgentDir holds the agent inside a sandbox, one directory per agent
// version (AgentPath).
const AgentDir = "/opt/cellfork"

// Registry knows the built-in templates. Safe for concurrent use.
type Registry struct {
	dataDir  string // <data>/templates
	agentDir string // host directory holding AgentFiles
	shared   Artifacts
	mu       sync.Mutex
	ready    map[string]string // name -> rootfs path
	used     map[string]string // name -> the artifact's root (shared)
}

// Artifacts is where the hosts of a cluster share the built-in templates'
// root file systems, so that a checkpoint taken on one host restores
// against the very same files on another: each definition is built once
// (by the first host that needs it), published, and every host pulls
// those bytes (verified) into the same path,
// <templates>/<name>/<definition>/<artifact>/rootfs, artifact being the
// first 16 characters of the published root.
type Artifacts interface {
	// Find returns the root published for a template's definition ("" if
	// none yet).
	Find(ctx context.Context, name, definition string) (root string, err error)
	// Publish packs rootfs, leaving out the agent's directory (each host
	// installs its own), and records it for the definition unless another
	// host did first; it returns the root on record.
	Publish(ctx context.Context, name, definition, rootfs string) (root string, err error)
	// Pull unpacks the root file system root names into dir, an empty
	// directory.
	Pull(ctx context.Context, root, dir string) error
}

// Share makes the registry take built-in templates' root file systems
// from a cluster's artifacts (before the first Rootfs).
func (r *Registry) Share(a Artifacts) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shared = a
}

// NewRegistry returns a registry that keeps rootfs trees under dataDir and
// installs the agent from agentDir.
func NewRegistry(dataDir, agentDir string) *Registry {
	return &Registry{dataDir: dataDir, agentDir: agentDir, ready: map[string]string{}, used: map[string]string{}}
}

// Artifact returns the root of the cluster artifact whose root file
// system the template's Rootfs is ("": not shared, or not resolved yet).
func (r *Registry) Artifact(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.used[name]
}

// Names returns the built-in template names (aliases resolve to them).
func Names() []string {
	var names []string
	for _, n := range aliases {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// Aliases returns the ids that name built-in template name (itself
// first).
func Aliases(name string) []string {
	out := []string{name}
	for a, n := range aliases {
		if n == name && a != name {
			out = append(out, a)
		}
	}
	slices.Sort(out[1:])
	return out
}

// Resolve maps a template id (or alias) to a built-in template name.
func Resolve(id string) (string, error) {
	if name, ok := aliases[id]; ok {
		return name, nil
	}
	return "", errdefs.New(errdefs.ErrNotFound, "template %q not found (available: base, code-interpreter-v1)", id)
}

// Rootfs returns the rootfs of a built template, building it first if
// needed. Build progress goes to progress.
func (r *Registry) Rootfs(ctx context.Context, name string, progress io.Writer) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.ready[name]; ok {
		return p, nil
	}
	p, err := r.build(ctx, name, progress)
	if err != nil {
		return "", err
	}
	r.ready[name] = p
	return p, nil
}

// definitionFiles are the files of a template that its rootfs is built
// from (pip is optional).
func definitionFiles(name string) []string {
	return []string{"build-rootfs.sh", name + "/packages", name + "/pip"}
}

// Hash identifies a template's definition.
func Hash(name string) (string, error) {
	h := sha256.New()
	for _, f := range definitionFiles(name) {
		b, err := fs.ReadFile(templates.FS, f)
		if errors.Is(err, fs.ErrNotExist) && f == name+"/pip" {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("reading template %s: %w", name, err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Preimport returns the modules the template's warm image pre-imports.
func Preimport(name string) []string {
	b, _ := fs.ReadFile(templates.FS, name+"/preimport")
	var mods []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			mods = append(mods, l)
		}
	}
	return mods
}

// WarmKey identifies what a template's warm image depends on besides its
// rootfs: the agent files, the pre-import list, the runtime build that
// writes and restores it (runtime: a runsc build restores only images of
// its own build) and the boot configuration (boot: the caller's description
// of what else the image freezes). Changing any makes a new warm image; the
// rootfs is not rebuilt.
func (r *Registry) WarmKey(name, runtime, boot string) (string, error) {
	v, err := r.agentVersion()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s %q %q %s", v, Preimport(name), runtime, boot)
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func (r *Registry) build(ctx context.Context, name string, progress io.Writer) (string, error) {
	hash, err := Hash(name)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(r.dataDir, name)
	rootfs := filepath.Join(dir, hash, "rootfs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Serialize builds across processes (`cellfork template build` and a
	// starting daemon may race).
	unlock, err := Lock(filepath.Join(dir, ".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	// Held for the life of the process: other daemons sharing this
	// template directory must not prune a rootfs that sandboxes run on.
	if _, err := InUse(filepath.Join(dir, hash)); err != nil {
		return "", err
	}
	if r.shared != nil {
		if rootfs, err = r.artifact(ctx, name, hash, progress); err != nil {
			return "", fmt.Errorf("template %s: %w", name, err)
		}
	} else if err := buildOnce(ctx, name, hash, rootfs, progress); err != nil {
		return "", err
	}
	r.prune(dir, hash, progress)
	if err := r.InstallAgent(rootfs); err != nil {
		return "", fmt.Errorf("installing agent into template %s: %w", name, err)
	}
	return rootfs, nil
}

// buildOnce builds the template's rootfs unless it is there.
func buildOnce(ctx context.Context, name, hash, rootfs string, progress io.Writer) error {
	if _, err := os.Stat(rootfs); err == nil {
		return nil
	}
	fmt.Fprintf(progress, "template %s: building rootfs %s (debootstrap, a few minutes)\n", name, hash)
	if err := runBuild(ctx, name, rootfs, progress); err != nil {
		return fmt.Errorf("building template %s: %w", name, err)
	}
	return nil
}

// artifactFile records, beside a definition's rootfs, the root of the
// artifact this host last used: a host (re)started while the cluster's
// database is down goes on with it.
const artifactFile = "artifact"

// artifact returns the rootfs of the template's published artifact for
// definition hash, publishing this host's build first when nobody has, and
// pulling it when it is not here. The caller holds the template's lock.
func (r *Registry) artifact(ctx context.Context, name, hash string, progress io.Writer) (string, error) {
	def := filepath.Join(r.dataDir, name, hash)
	root, err := r.shared.Find(ctx, name, hash)
	if err != nil {
		b, rerr := os.ReadFile(filepath.Join(def, artifactFile))
		last := strings.TrimSpace(string(b))
		if rerr != nil || len(last) < 16 || !isDir(filepath.Join(def, last[:16], "rootfs")) {
			return "", fmt.Errorf("finding its root file system in the cluster (and this host has none pulled before): %w", err)
		}
		fmt.Fprintf(progress, "template %s: the cluster does not answer (%v); using the root file system pulled before, %s\n", name, err, last[:16])
		root = last
	}
	if root == "" {
		local := filepath.Join(def, "rootfs")
		if err := buildOnce(ctx, name, hash, local, progress); err != nil {
			return "", err
		}
		// What InstallAgent adds besides the agent, in the artifact: the same
		// file on every host.
		if err := keepTmpOnRoot(local); err != nil {
			return "", err
		}
		fmt.Fprintf(progress, "template %s: publishing its root file system to the cluster\n", name)
		t0 := time.Now()
		if root, err = r.shared.Publish(ctx, name, hash, local); err != nil {
			return "", fmt.Errorf("publishing its root file system: %w", err)
		}
		fmt.Fprintf(progress, "template %s: published as %s in %v\n", name, root, time.Since(t0).Round(time.Millisecond))
	}
	if len(root) < 16 || strings.Trim(root, "0123456789abcdef") != "" {
		return "", fmt.Errorf("the cluster names a malformed root %q for it", root)
	}
	adir := filepath.Join(def, root[:16])
	rootfs := filepath.Join(adir, "rootfs")
	if !isDir(rootfs) {
		// Every host, the publisher too, unpacks the same bytes.
		fmt.Fprintf(progress, "template %s: pulling its root file system %s from the cluster\n", name, root[:16])
		t0 := time.Now()
		tmp := adir + ".tmp-" + strconv.Itoa(os.Getpid())
		_ = os.RemoveAll(tmp)
		if err := os.MkdirAll(filepath.Join(tmp, "rootfs"), 0o755); err != nil {
			return "", err
		}
		if err := r.shared.Pull(ctx, root, filepath.Join(tmp, "rootfs")); err != nil {
			_ = os.RemoveAll(tmp)
			return "", fmt.Errorf("pulling its root file system %s: %w", root, err)
		}
		if err := os.Rename(tmp, adir); err != nil {
			_ = os.RemoveAll(tmp)
			return "", err
		}
		fmt.Fprintf(progress, "template %s: pulled in %v\n", name, time.Since(t0).Round(time.Millisecond))
	}
	if _, err := InUse(adir); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(def, artifactFile), []byte(root+"\n"), 0o644); err != nil {
		return "", err
	}
	r.used[name] = root
	// Older artifacts of this definition that no daemon uses.
	entries, _ := os.ReadDir(def)
	for _, e := range entries {
		switch n := e.Name(); {
		case strings.Contains(n, ".tmp-"): // a pull that died (pulls hold the lock)
			_ = os.RemoveAll(filepath.Join(def, n))
		case e.IsDir() && len(n) == 16 && n != root[:16] && Prune(filepath.Join(def, n)):
			fmt.Fprintf(progress, "template %s: removed old artifact %s\n", name, n)
		}
	}
	return rootfs, nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

func runBuild(ctx context.Context, name, rootfs string, progress io.Writer) error {
	tmp, err := os.MkdirTemp("", "cellfork-template-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	args := []string{filepath.Join(tmp, "build-rootfs.sh"), filepath.Join(tmp, "packages"), rootfs}
	for _, src := range definitionFiles(name) {
		b, err := fs.ReadFile(templates.FS, src)
		if errors.Is(err, fs.ErrNotExist) && src == name+"/pip" {
			continue
		}
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, filepath.Base(src)), b, 0o755); err != nil {
			return err
		}
		if src == name+"/pip" {
			args = append(args, filepath.Join(tmp, "pip"))
		}
	}
	cmd := exec.CommandContext(ctx, "bash", args...)
	cmd.Stdout, cmd.Stderr = progress, progress
	return cmd.Run()
}

// prune removes rootfs trees of older definitions of the template that no
// running daemon uses.
func (r *Registry) prune(dir, keep string, progress io.Writer) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() && e.Name() != keep && Prune(filepath.Join(dir, e.Name())) {
			fmt.Fprintf(progress, "template: removed old rootfs %s\n", e.Name())
		}
	}
}

// TmpMarker is a file the daemon keeps in every rootfs's /tmp. gVisor
// mounts a tmpfs over an empty /tmp, and that tmpfs has no size: filling it
// would end the sandbox at its memory limit. A /tmp that is not empty stays
// on the root overlay, whose size the sandbox's disk limit bounds (writes
// past it fail with ENOSPC).
const TmpMarker = "tmp/.cellfork"

// agentVersion is the hash of the agent files.
func (r *Registry) agentVersion() (string, error) {
	h := sha256.New()
	for _, f := range AgentFiles {
		b, err := os.ReadFile(filepath.Join(r.agentDir, f))
		if err != nil {
			return "", fmt.Errorf("agent file missing (run `make build`): %w", err)
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// AgentPath is the agent's executable inside a sandbox:
// /opt/cellfork/<version>/cellfork-agent. Each version has its own
// directory, never rewritten, so daemons of different versions can share a
// rootfs: a checkpoint restores against the very files it was taken with.
func (r *Registry) AgentPath() (string, error) {
	v, err := r.agentVersion()
	if err != nil {
		return "", err
	}
	return filepath.Join(AgentDir, v, "cellfork-agent"), nil
}

// InstallAgent puts this version's agent files in the rootfs (once:
// written beside, then renamed into place) and TmpMarker in /tmp.
func (r *Registry) InstallAgent(rootfs string) error {
	if err := keepTmpOnRoot(rootfs); err != nil {
		return err
	}
	p, err := r.AgentPath()
	if err != nil {
		return err
	}
	dst := filepath.Join(rootfs, filepath.Dir(p))
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(rootfs, AgentDir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Join(rootfs, AgentDir), ".install-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	for _, f := range AgentFiles {
		b, err := os.ReadFile(filepath.Join(r.agentDir, f))
		if err != nil {
			return fmt.Errorf("agent file missing (run `make build`): %w", err)
		}
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o755); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, dst); err != nil && !os.IsExist(err) && !errors.Is(err, syscall.ENOTEMPTY) {
		return err
	}
	return nil
}

func keepTmpOnRoot(rootfs string) error {
	tmp := filepath.Join(rootfs, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o777|os.ModeSticky); err != nil {
		return err
	}
	marker := filepath.Join(rootfs, TmpMarker)
	if _, err := os.Stat(marker); err == nil {
		return nil
	}
	return os.WriteFile(marker, nil, 0o444)
}

// inUse holds the lock files of InUse: a flock lasts as long as its file
// is open, and an unreferenced *os.File is closed by the garbage collector.
var inUse struct {
	sync.Mutex
	files map[*os.File]bool
}

// InUse marks dir as used by this process until release (or exit): Prune
// leaves it alone. (A shared flock on dir + ".inuse"; any number of
// daemons may hold it.)
func InUse(dir string) (release func(), err error) {
	f, err := os.OpenFile(dir+".inuse", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		f.Close()
		return nil, err
	}
	inUse.Lock()
	if inUse.files == nil {
		inUse.files = map[*os.File]bool{}
	}
	inUse.files[f] = true
	inUse.Unlock()
	return func() {
		inUse.Lock()
		delete(inUse.files, f)
		inUse.Unlock()
		f.Close()
	}, nil
}

// Prune removes dir unless some process holds it InUse, and reports
// whether it did.
func Prune(dir string) bool {
	f, err := os.OpenFile(dir+".inuse", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return false
	}
	defer f.Close()
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		return false
	}
	os.RemoveAll(dir)
	os.Remove(dir + ".inuse")
	return true
}

// Lock takes an exclusive lock on path (created if needed), waiting for it,
// and returns its release.
func Lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
