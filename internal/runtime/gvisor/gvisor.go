// Package gvisor implements sandbox.Runtime with runsc (gVisor, systrap
// platform). Each sandbox is one runsc sandbox whose root filesystem is the
// template rootfs with an in-memory overlay (--overlay2=root:memory), so
// writes never touch the shared rootfs and a checkpoint captures them. The
// overlay's size is fixed when a sandbox is started or prepared; a restore
// keeps the size frozen in its image, whatever the flag says.
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// Config configures the driver.
type Config struct {
	Runsc string // path to a static runsc; sidecars in gvisor-bin/ beside it
	Root  string // runsc state directory
	// CgroupParent is the cgroup under which each sandbox gets its own.
	CgroupParent string
}

// Runtime drives runsc. Safe for concurrent use.
type Runtime struct {
	cfg   Config
	build string // runsc's version: its build id
	watch watcher
	bases heldBases     // of images on tmpfs (bases.go)
	ahead restoresAhead // restores started before their image is known (ahead.go)
	bg    string        // cgroup.procs where Background sandboxes' runsc commands run (background.go)
}

var _ sandbox.Runtime = (*Runtime)(nil)

// New checks the configuration and returns a Runtime.
func New(cfg Config) (*Runtime, error) {
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "/cellfork"
	}
	if _, err := os.Stat(cfg.Runsc); err != nil {
		return nil, fmt.Errorf("runsc not found at %s (run `make setup`): %w", cfg.Runsc, err)
	}
	build, err := runscBuild(cfg.Runsc)
	if err != nil {
		return nil, err
	}
	for _, dir := range []string{cfg.Root, marksDir(cfg.Root)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating runsc root: %w", err)
		}
	}
	r := &Runtime{cfg: cfg, build: build, bg: backgroundCgroup(cfg.CgroupParent)}
	r.ahead.supported = aheadSupported(cfg.Runsc)
	return r, nil
}

// Build is the build id of the runsc this runtime drives (what `runsc
// --version` says): images are only restored by the build that wrote them,
// so it is part of the key of every warm image.
func (r *Runtime) Build() string { return r.build }

// globalFlags are the flags every runsc call gets. The overlay's size
// (diskMB, 0 = unbounded) only matters to the call that starts or prepares
// a sandbox: past it, writes to the root fail with ENOSPC. A writable root
// has no overlay: writes go to the root directory itself.
func (r *Runtime) globalFlags(logFile string, diskMB int, writableRoot bool) []string {
	overlay := "--overlay2=root:memory"
	if diskMB > 0 {
		overlay += fmt.Sprintf(",size=%dm", diskMB)
	}
	if writableRoot {
		overlay = "--overlay2=none"
	}
	f := []string{
		"--root=" + r.cfg.Root,
		"--platform=systrap",
		"--network=sandbox",
		overlay,
		"--host-settings=ignore",
		"--restore-spec-validation=warning",
		// sudo works for the sandbox's user, as in E2B: inside the
		// sandbox root is no host privilege, and nothing the agent starts
		// has CAP_SYS_RESOURCE to lift its limits.
		"--allow-suid",
	}
	if logFile != "" {
		f = append(f, "--log="+logFile)
	}
	return f
}

// runsc runs one short runsc command with a timeout and returns its output.
// The caller going away does not cut it short (see detached).
func (r *Runtime) runsc(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.cfg.Runsc, append(r.globalFlags("", 0, false), args...)...)
	cmd.SysProcAttr = diesWithDaemon()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == runscFatal && lastLine(msg) == runscUnknownID {
			err = errUnknownContainer
		}
		return out, fmt.Errorf("runsc %s: %w: %s", args[0], err, msg)
	}
	return out, nil
}

// What the pinned runsc prints, and the status it exits with, when no
// container has the id (or id prefix) it was given: cli.go's Fatalf of
// container.Load's os.ErrNotExist (runsc/container/state_file.go,
// findContainerID). `delete --force` of such an id succeeds instead.
// Only exactly this reads as "already gone": a missing runsc binary, a
// missing bundle or state file, or any other failure stays an error.
// TestUnknownContainer pins it against the installed runsc.
const (
	runscUnknownID = "FetchSpec failed: loading container: file does not exist"
	runscFatal     = 128
)

// errUnknownContainer marks a runsc call that failed because runsc knows
// no container of that id.
var errUnknownContainer = errors.New("no such container")

func lastLine(s string) string {
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// writeBundle writes the OCI bundle and opens the sandbox's console log
// (its stdio: files, never a pipe, since runsc hands it to the long-lived
// sandbox).
func (r *Runtime) writeBundle(ctx context.Context, s sandbox.Spec) (*os.File, error) {
	defer timing.Since(ctx, "bundle", time.Now())
	if filepath.Base(s.BundleDir) != s.RuntimeID {
		// processes() finds a sandbox's processes by it.
		return nil, fmt.Errorf("bundle directory %s is not named after sandbox %s", s.BundleDir, s.RuntimeID)
	}
	b, err := json.MarshalIndent(ociSpec(s, filepath.Join(r.cfg.CgroupParent, s.RuntimeID)), "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.BundleDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(s.BundleDir, "config.json"), b, 0o600); err != nil {
		return nil, err
	}
	return os.OpenFile(filepath.Join(s.BundleDir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
}

// detached runs a runsc command that leaves a sandbox behind (run, create,
// restore). On failure it destroys whatever the command left (gVisor G7).
func (r *Runtime) detached(ctx context.Context, phase string, s sandbox.Spec, out *os.File, args ...string) error {
	defer timing.Since(ctx, phase, time.Now())
	// Never cut short by the caller (a client gone, the pool closing): a
	// runsc killed between starting the sandbox and writing its state
	// leaves a sandbox no runsc command can name, running for good. The
	// caller destroys what it no longer wants once this returns.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), detachedTimeout)
	defer cancel()
	cmd := exec.CommandContext(rctx, r.cfg.Runsc, r.detachedFlags(s, args...)...)
	cmd.SysProcAttr = diesWithDaemon()
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Start()
	if err == nil {
		if s.Background && r.bg != "" {
			// Best effort: at the normal share if it fails.
			_ = os.WriteFile(r.bg, []byte(strconv.Itoa(cmd.Process.Pid)), 0)
		}
		err = cmd.Wait()
	}
	return r.detachedDone(ctx, s, args[0], err)
}

// detachedTimeout bounds a runsc command that leaves a sandbox behind.
const detachedTimeout = 60 * time.Second

// detachedFlags are a detached command's whole argument list.
func (r *Runtime) detachedFlags(s sandbox.Spec, args ...string) []string {
	full := r.globalFlags(filepath.Join(s.BundleDir, "runsc.log"), s.Limits.DiskMB, s.WritableRoot)
	if s.RootfsUpper != "" {
		// Only the boot that seeds its root filesystem from a tar asks
		// for it: other sandboxes' configuration stays as their images
		// were taken with.
		full = append(full, "--allow-rootfs-tar-annotation")
	}
	return append(full, args...)
}

// detachedDone destroys what a failed detached command left.
func (r *Runtime) detachedDone(ctx context.Context, s sandbox.Spec, command string, err error) error {
	if err == nil {
		return nil
	}
	_ = r.Destroy(context.WithoutCancel(ctx), s.RuntimeID)
	return fmt.Errorf("runsc %s: %w%s", command, err, tail(filepath.Join(s.BundleDir, "runsc.log")))
}

// Start boots a sandbox and returns once its init process runs.
func (r *Runtime) Start(ctx context.Context, s sandbox.Spec) error {
	out, err := r.writeBundle(ctx, s)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := r.detached(ctx, "runsc", s, out, "run", "--detach", "--bundle="+s.BundleDir, pidFile(s.BundleDir), s.RuntimeID); err != nil {
		return err
	}
	r.shapeCPU(s)
	return nil
}

// Prepare creates a sandbox that runs nothing yet (sentry, gofer, cgroups
// and namespaces up), to Restore into later: that moves the fixed cost of a
// restore off the critical path.
func (r *Runtime) Prepare(ctx context.Context, s sandbox.Spec) error {
	out, err := r.writeBundle(ctx, s)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := r.detached(ctx, "runsc-create", s, out, "create", "--bundle="+s.BundleDir, pidFile(s.BundleDir), s.RuntimeID); err != nil {
		return err
	}
	r.shapeCPU(s)
	r.startAhead(s, out)
	return nil
}

// shapeCPU gives a sandbox's CPU cgroup, once runsc has made it, what its
// OCI spec cannot say (cgroup.go): a burst of a whole period's quota, and
// idle until Foreground if Background. Best effort: without them the
// quota and the spec's weight still hold.
func (r *Runtime) shapeCPU(s sandbox.Spec) {
	dir := cpuDir(filepath.Join(r.cfg.CgroupParent, s.RuntimeID))
	_ = writeCgroupBurst(dir, cpuQuota(s))
	if s.Background {
		_ = writeCgroupIdle(dir, true)
	}
}

// Restore starts a sandbox from a checkpoint image. If s.RuntimeID was
// Prepared, the image is restored into that sandbox; otherwise a new one is
// created from s.
func (r *Runtime) Restore(ctx context.Context, s sandbox.Spec, image string, prepared bool) error {
	if err := r.checkImageBuild(image); err != nil {
		return err
	}
	r.bases.sweep()
	if !prepared {
		out, err := r.writeBundle(ctx, s)
		if err != nil {
			return err
		}
		defer out.Close()
		if err := r.detached(ctx, "restore", s, out, "restore", "--detach", "--image-path="+image, "--bundle="+s.BundleDir, pidFile(s.BundleDir), s.RuntimeID); err != nil {
			return err
		}
		r.shapeCPU(s)
		return nil
	}
	if done, err := r.restoreAhead(ctx, s, image); done {
		return err
	}
	out, err := os.OpenFile(filepath.Join(s.BundleDir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	return r.detached(ctx, "restore", s, out, preparedRestore(s, image)...)
}

// preparedRestore is the runsc command that restores image into s's
// prepared sandbox.
func preparedRestore(s sandbox.Spec, image string) []string {
	return []string{"restore", "--detach", "--image-path=" + image, "--bundle=" + s.BundleDir, s.RuntimeID}
}

// Checkpoint saves the sandbox's whole state (memory, processes, the
// in-memory root overlay, sockets) into dir, which must exist and be empty.
// With leaveRunning the sandbox goes on; otherwise it stops and must then
// be Destroyed.
func (r *Runtime) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	defer timing.Since(ctx, "checkpoint", time.Now())
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	// Without leaveRunning the sandbox stops after the save (its caller
	// destroys it).
	if err := r.checkpoint(ctx, id, dir, leaveRunning); err != nil {
		return fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	return nil
}

// pidFile asks runsc to write the sandbox process's pid into the bundle, so
// that watching it needs no runsc call.
func pidFile(bundle string) string { return "--pid-file=" + filepath.Join(bundle, "pid") }

// diesWithDaemon makes a runsc command die with the daemon, so that a
// crashed daemon leaves no command acting on sandboxes behind its
// successor's back. (The sandboxes runsc starts are not its children and
// live on.)
func diesWithDaemon() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// execOutput runs a command that leaves nothing behind and returns its
// standard output.
func execOutput(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// tail returns the last lines of a log file, for error messages in the log.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return ": " + strings.TrimSpace(string(b))
}

// Destroy kills and deletes the sandbox and removes its cgroups. Its
// processes are killed even when runsc fails (the failure is still
// returned): a sandbox never outlives a Destroy.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	defer r.bases.sweep()
	r.ahead.stop(id)
	_, err := r.runsc(ctx, 30*time.Second, "delete", "--force", id)
	if notExist(err) {
		err = nil
	}
	// runsc may not know it while its processes run: a runsc killed (with
	// the daemon) before it wrote the sandbox's state.
	for _, pid := range r.processes()[id] {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	removeCgroups(filepath.Join(r.cfg.CgroupParent, id))
	r.clearMarks(id)
	if err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	return nil
}

// notExist reports whether a runsc call failed because runsc knows no
// container of that id.
func notExist(err error) bool { return errors.Is(err, errUnknownContainer) }

type stateOut struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// State returns the status of the sandbox: runsc's ("created", "running",
// "stopped"), "paused" after Pause, "" if runsc does not know it, or
// sandbox.RuntimeUnsure after a pause or resume was cut short (or when the
// runsc CLI paused it).
func (r *Runtime) State(ctx context.Context, id string) (string, error) {
	out, err := r.runsc(ctx, 10*time.Second, "state", id)
	if err != nil {
		if notExist(err) {
			return "", nil
		}
		return "", err
	}
	var st stateOut
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("parsing runsc state: %w", err)
	}
	switch {
	case st.Status == "paused" || st.Status == "running" && r.hasMark(id, markPausing):
		return sandbox.RuntimeUnsure, nil
	case st.Status == "running" && r.hasMark(id, markPaused):
		return "paused", nil
	}
	return st.Status, nil
}

// List returns the ids of every container in the runsc root.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	out, err := r.runsc(ctx, 10*time.Second, "list", "--format=json")
	if err != nil {
		return nil, err
	}
	var sts []stateOut
	if err := json.Unmarshal(out, &sts); err != nil && len(bytes.TrimSpace(out)) > 0 && string(bytes.TrimSpace(out)) != "null" {
		return nil, fmt.Errorf("parsing runsc list: %w", err)
	}
	ids := make([]string, 0, len(sts))
	for _, s := range sts {
		ids = append(ids, s.ID)
	}
	for id := range r.processes() {
		if !slices.Contains(ids, id) {
			ids = append(ids, id) // strays: see Destroy
		}
	}
	return ids, nil
}

// processes finds the sandbox and gofer processes of this runsc root, by
// sandbox id. A sandbox's log is <bundle>/runsc.log, and bundles are named
// by sandbox id, so the id is read from the --log flag.
func (r *Runtime) processes() map[string][]int {
	out := map[string][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if args[0] != "runsc-sandbox" && args[0] != "runsc-gofer" {
			continue
		}
		var root, log string
		for _, a := range args[1:] {
			if v, ok := strings.CutPrefix(a, "--root="); ok {
				root = v
			} else if v, ok := strings.CutPrefix(a, "--log="); ok {
				log = v
			}
		}
		if root == r.cfg.Root && filepath.Base(log) == "runsc.log" {
			id := filepath.Base(filepath.Dir(log))
			out[id] = append(out[id], pid)
		}
	}
	return out
}

// SetPidsMax resizes the sandbox's host pids cgroup to fit pidsMax
// processes inside.
func (r *Runtime) SetPidsMax(_ context.Context, id string, pidsMax int) error {
	if err := writeCgroupPids(filepath.Join(r.cfg.CgroupParent, id), hostPids(pidsMax)); err != nil {
		return fmt.Errorf("setting the pids limit of sandbox %s: %w", id, err)
	}
	return nil
}

// Foreground gives a Background sandbox the normal CPU share.
func (r *Runtime) Foreground(_ context.Context, id string) error {
	if err := writeCgroupNormalWeight(filepath.Join(r.cfg.CgroupParent, id)); err != nil {
		return fmt.Errorf("raising the CPU weight of sandbox %s: %w", id, err)
	}
	return nil
}

// Stats reads the sandbox's cgroup counters.
func (r *Runtime) Stats(ctx context.Context, id string) (sandbox.Stats, error) {
	st, err := readCgroupStats(filepath.Join(r.cfg.CgroupParent, id))
	if errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("sandbox %s has no cgroup: %w", id, err)
	}
	return st, err
}
