// Package gvisor implements sandbox.Runtime with runsc (gVisor, systrap
// platform). Each sandbox is one runsc sandbox whose root filesystem is the
// template rootfs with an in-memory overlay (--overlay2=root:memory), so
// writes never touch the shared rootfs and a checkpoint captures them.
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
	"strings"
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
	cfg Config
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
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("creating runsc root: %w", err)
	}
	return &Runtime{cfg: cfg}, nil
}

// globalFlags are the flags every runsc call gets; they must be the same for
// every call on one container.
func (r *Runtime) globalFlags(logFile string) []string {
	f := []string{
		"--root=" + r.cfg.Root,
		"--platform=systrap",
		"--network=sandbox",
		"--overlay2=root:memory",
		"--host-settings=ignore",
		"--restore-spec-validation=warning",
	}
	if logFile != "" {
		f = append(f, "--log="+logFile)
	}
	return f
}

// runsc runs one short runsc command with a timeout and returns its output.
func (r *Runtime) runsc(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.cfg.Runsc, append(r.globalFlags(""), args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("runsc %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Start writes the OCI bundle and runs the sandbox detached. The sandbox's
// stdio goes to files in the bundle (never to a pipe: runsc hands it to the
// long-lived sandbox).
func (r *Runtime) Start(ctx context.Context, s sandbox.Spec) (err error) {
	t0 := time.Now()
	spec := ociSpec(s, filepath.Join(r.cfg.CgroupParent, s.RuntimeID))
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.BundleDir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.BundleDir, "config.json"), b, 0o600); err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(s.BundleDir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	timing.Since(ctx, "bundle", t0)

	t1 := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	args := append(r.globalFlags(filepath.Join(s.BundleDir, "runsc.log")),
		"run", "--detach", "--bundle="+s.BundleDir, s.RuntimeID)
	cmd := exec.CommandContext(rctx, r.cfg.Runsc, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		// A failed start can leave state and cgroups behind (gVisor G7).
		_ = r.Destroy(context.WithoutCancel(ctx), s.RuntimeID)
		return fmt.Errorf("runsc run: %w%s", err, tail(filepath.Join(s.BundleDir, "runsc.log")))
	}
	timing.Since(ctx, "runsc", t1)
	return nil
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

// Destroy kills and deletes the sandbox and removes its cgroups.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	_, err := r.runsc(ctx, 30*time.Second, "delete", "--force", id)
	if err != nil && !notExist(err) {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	removeCgroups(filepath.Join(r.cfg.CgroupParent, id))
	return nil
}

func notExist(err error) bool {
	s := err.Error()
	return strings.Contains(s, "does not exist") || strings.Contains(s, "not found") ||
		strings.Contains(s, "no such file")
}

type stateOut struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// Running reports whether runsc knows the sandbox and it is running.
func (r *Runtime) Running(ctx context.Context, id string) (bool, error) {
	out, err := r.runsc(ctx, 10*time.Second, "state", id)
	if err != nil {
		if notExist(err) {
			return false, nil
		}
		return false, err
	}
	var st stateOut
	if err := json.Unmarshal(out, &st); err != nil {
		return false, fmt.Errorf("parsing runsc state: %w", err)
	}
	return st.Status == "running" || st.Status == "created", nil
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
	return ids, nil
}

// Stats reads the sandbox's cgroup counters.
func (r *Runtime) Stats(ctx context.Context, id string) (sandbox.Stats, error) {
	st, err := readCgroupStats(filepath.Join(r.cfg.CgroupParent, id))
	if errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("sandbox %s has no cgroup: %w", id, err)
	}
	return st, err
}
