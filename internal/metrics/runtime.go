package metrics

import (
	"context"
	"os"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/timing"
)

// Image kinds, as a KindFunc names them.
const (
	ImageTemplate = "template" // a template's warm image
	ImageSnapshot = "snapshot"
	ImageFork     = "fork"
	ImagePaused   = "pause" // a sandbox paused to disk
	// ImageFilesystem is a filesystem-only pause's tar of the root
	// filesystem's changes (not a checkpoint image; counted as one).
	ImageFilesystem = "filesystem"
	ImageOther      = "other"
)

// KindFunc says what a checkpoint image directory holds (Image*), from
// where it lies.
type KindFunc func(dir string) string

// Runtime returns rt with its calls counted and timed: runtime operations,
// restores and checkpoints with their bytes, and the pool's refills. A
// call made for a request (its context carries a timing.Recorder) is a
// "request" trigger; any other is "background" (the pool, standbys,
// spills, warm images).
func (h *Host) Runtime(rt sandbox.Runtime, kind KindFunc) sandbox.Runtime {
	return &instrumented{Runtime: rt, h: h, kind: kind}
}

type instrumented struct {
	sandbox.Runtime
	h    *Host
	kind KindFunc
}

func trigger(ctx context.Context) string {
	if timing.From(ctx) != nil {
		return "request"
	}
	return "background"
}

// observe counts and times one runtime call.
func (r *instrumented) observe(op string, start time.Time, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	r.h.runtimeOps.WithLabelValues(op, result).Inc()
	r.h.runtimeLatency.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

func (r *instrumented) refill(kind string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	r.h.refills.WithLabelValues(kind, result).Inc()
}

func (r *instrumented) Start(ctx context.Context, s sandbox.Spec) error {
	t0 := time.Now()
	err := r.Runtime.Start(ctx, s)
	r.observe("start", t0, err)
	return err
}

func (r *instrumented) Prepare(ctx context.Context, s sandbox.Spec) error {
	t0 := time.Now()
	err := r.Runtime.Prepare(ctx, s)
	r.observe("prepare", t0, err)
	if trigger(ctx) == "background" {
		r.refill("shell", err)
	}
	return err
}

func (r *instrumented) Restore(ctx context.Context, s sandbox.Spec, image string, prepared bool) error {
	t0 := time.Now()
	err := r.Runtime.Restore(ctx, s, image, prepared)
	r.observe("restore", t0, err)
	src, trig := r.kind(image), trigger(ctx)
	if trig == "background" {
		switch src {
		case ImageTemplate:
			r.refill("ready", err)
		case ImageSnapshot:
			r.refill("standby", err)
		}
	}
	if err == nil {
		r.h.restores.WithLabelValues(src, trig).Inc()
		r.h.restoreBytes.WithLabelValues(src).Add(float64(dirSize(image)))
	}
	return err
}

func (r *instrumented) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	t0 := time.Now()
	err := r.Runtime.Checkpoint(ctx, id, dir, leaveRunning)
	r.observe("checkpoint", t0, err)
	if err == nil {
		k := r.kind(dir)
		r.h.checkpoints.WithLabelValues(k, trigger(ctx)).Inc()
		r.h.checkpointBytes.WithLabelValues(k).Add(float64(dirSize(dir)))
	}
	return err
}

// ExportRootfs is a filesystem-only pause's save: counted as a checkpoint
// of kind "filesystem", with the tar's bytes.
func (r *instrumented) ExportRootfs(ctx context.Context, id, path string) error {
	t0 := time.Now()
	err := r.Runtime.ExportRootfs(ctx, id, path)
	r.observe("export_rootfs", t0, err)
	if err == nil {
		r.h.checkpoints.WithLabelValues(ImageFilesystem, trigger(ctx)).Inc()
		if fi, err := os.Stat(path); err == nil {
			r.h.checkpointBytes.WithLabelValues(ImageFilesystem).Add(float64(fi.Size()))
		}
	}
	return err
}

func (r *instrumented) Pause(ctx context.Context, id string) error {
	t0 := time.Now()
	err := r.Runtime.Pause(ctx, id)
	r.observe("pause", t0, err)
	return err
}

func (r *instrumented) Resume(ctx context.Context, id string) error {
	t0 := time.Now()
	err := r.Runtime.Resume(ctx, id)
	r.observe("resume", t0, err)
	return err
}

func (r *instrumented) Destroy(ctx context.Context, id string) error {
	t0 := time.Now()
	err := r.Runtime.Destroy(ctx, id)
	r.observe("destroy", t0, err)
	return err
}

// dirSize is the bytes of the files directly in dir (a checkpoint image
// is flat).
func dirSize(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}
