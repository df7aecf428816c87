package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// DefaultReadyWait is how long a start command without a ready check runs
// before the template counts as ready (E2B's default ready command is
// `sleep 20`).
const DefaultReadyWait = 20 * time.Second

// finish flattens the chain into job.Dir/rootfs, installs the agent and
// makes the warm image.
func (b *Builder) finish(ctx context.Context, job Job, chain []string, c Context, log func(string, string, string, ...any)) (*Result, error) {
	if err := os.MkdirAll(job.Dir, 0o700); err != nil {
		return nil, err
	}
	rootfs := filepath.Join(job.Dir, "rootfs")
	if _, err := os.Stat(rootfs); err != nil {
		t0 := time.Now()
		if err := b.cfg.Layers.Flatten(chain, rootfs); err != nil {
			return nil, fmt.Errorf("flattening the layers: %w", err)
		}
		log("debug", StepFinalize, "root file system assembled from %d layers in %s", len(chain), time.Since(t0).Round(time.Millisecond))
	}
	if err := b.cfg.Agent.InstallAgent(rootfs); err != nil {
		return nil, fmt.Errorf("installing the agent: %w", err)
	}
	res := &Result{Layers: chain, Context: c, Rootfs: rootfs}
	key, err := b.WarmKey(job.Spec, c, job.Limits)
	if err != nil {
		return nil, err
	}
	image := filepath.Join(job.Dir, "warm-"+key)
	if _, err := os.Stat(filepath.Join(image, "checkpoint.img")); err != nil {
		if err := b.Warm(ctx, rootfs, job.Spec, c, job.Limits, image, job.Log); err != nil {
			return nil, err
		}
	}
	res.Image, res.WarmKey = image, key
	return res, nil
}

// WarmKey identifies a warm image: the agent, the boot configuration it
// freezes, and what runs in it.
func (b *Builder) WarmKey(sp Spec, c Context, limits sandbox.Limits) (string, error) {
	agent, err := b.cfg.Agent.AgentPath()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%q\x00%q\x00%s", agent, b.cfg.Runner.BootKey(limits), sp.StartCmd, sp.ReadyCmd, c.canonical())
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Warm boots rootfs with the template's limits, hands the agent the
// template's defaults, runs the start command until its ready check passes
// (and the default code context is up, where the image has Python), and
// checkpoints the sandbox into image.
func (b *Builder) Warm(ctx context.Context, rootfs string, sp Spec, c Context, limits sandbox.Limits, image string, logf func(Entry)) error {
	log := func(level, format string, args ...any) {
		logf(Entry{Level: level, Step: StepFinalize, Message: fmt.Sprintf(format, args...)})
	}
	box, err := b.cfg.Runner.Boot(ctx, rootfs, limits, false)
	if err != nil {
		return fmt.Errorf("starting the template: %w", err)
	}
	defer box.Destroy(context.WithoutCancel(ctx))
	a := newAgent(box.Transport())
	if err := a.init(ctx, c, 0); err != nil {
		return err
	}
	shell := "/bin/sh"
	if exists(rootfs, "/bin/bash") {
		shell = "/bin/bash"
	}
	out := func(line string, stderr bool) {
		level := "info"
		if stderr {
			level = "warn"
		}
		log(level, "%s", line)
	}
	var proc *started
	if sp.StartCmd != "" {
		log("info", "Running start command: %s", sp.StartCmd)
		proc, err = a.start(ctx, command{shell: shell, cmd: sp.StartCmd, c: c, out: out})
		if err != nil {
			return fmt.Errorf("start command failed: %w", err)
		}
		defer func() {
			if proc != nil {
				proc.detach()
			}
		}()
	}
	if err := b.ready(ctx, a, shell, sp, c, proc, log); err != nil {
		return err
	}
	if proc != nil {
		if ended, err := proc.result(); ended {
			if err != nil {
				return fmt.Errorf("start command failed: %w", err)
			}
			log("warn", "the start command has exited; the template has nothing running")
		}
		proc.detach() // it keeps running, and is checkpointed running
		proc = nil
	}
	// A Python image gets the code interpreter's default context warm too.
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	if err := a.waitReady(rctx); err != nil {
		log("debug", "no default code context (%v): run_code will start one on first use", err)
	}
	cancel()
	tmp := image + ".tmp-" + fmt.Sprint(time.Now().UnixNano())
	t0 := time.Now()
	if err := box.Checkpoint(ctx, tmp); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("taking the warm snapshot: %w", err)
	}
	if err := os.Rename(tmp, image); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	log("info", "Snapshot of the running template taken in %s", time.Since(t0).Round(time.Millisecond))
	return nil
}

// ready runs the ready check until it passes (E2B retries it every two
// seconds for up to ten minutes; we retry faster, within ReadyTimeout).
func (b *Builder) ready(ctx context.Context, a *agent, shell string, sp Spec, c Context, proc *started, log func(string, string, ...any)) error {
	cmd := sp.ReadyCmd
	if cmd == "" {
		if sp.StartCmd == "" {
			return nil
		}
		cmd = fmt.Sprintf("sleep %d", int(DefaultReadyWait.Seconds()))
	}
	log("info", "Waiting for template to be ready: %s", cmd)
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ReadyTimeout)
	defer cancel()
	delay := 100 * time.Millisecond
	for {
		err := a.run(ctx, command{shell: shell, cmd: cmd, c: c, out: func(line string, _ bool) { log("debug", "%s", line) }})
		if err == nil {
			log("info", "Template is ready (%s)", time.Since(t0).Round(time.Millisecond))
			return nil
		}
		var exit *errExit
		if !errors.As(err, &exit) && ctx.Err() == nil {
			return fmt.Errorf("ready command failed: %w", err)
		}
		if proc != nil {
			if ended, perr := proc.result(); ended && perr != nil {
				return fmt.Errorf("start command failed: %w", perr)
			}
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return errdefs.New(errdefs.ErrResourceExhausted, "ready command timed out after %s: %s", b.cfg.ReadyTimeout, cmd)
			}
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}
