// Package runtimetest is the contract every sandbox.Runtime keeps, as a
// test suite (containerd's snapshotter suite is the model): the gVisor
// runtime and the fake run the same tests, so the manager's unit tests on
// the fake say something about gVisor.
package runtimetest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// Env is a runtime under test.
type Env struct {
	Runtime sandbox.Runtime
	// Spec returns the spec of a sandbox with runtime id rid that runs
	// until it is destroyed (its bundle directory in a test temp dir, its
	// network made for it).
	Spec func(t *testing.T, rid string) sandbox.Spec
}

// rid returns a runtime id: fixed length, as the runtimes ask.
func rid() string { return sandbox.RandomHex(12) }

// Run runs the suite; newEnv is called once.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	e := newEnv(t)
	ctx := context.Background()
	state := func(t *testing.T, id, want string) {
		t.Helper()
		if got, err := e.Runtime.State(ctx, id); err != nil || got != want {
			t.Fatalf("State(%s) = %q, %v; want %q", id, got, err, want)
		}
	}
	start := func(t *testing.T) (string, sandbox.Spec) {
		t.Helper()
		id := rid()
		s := e.Spec(t, id)
		if err := e.Runtime.Start(ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Runtime.Destroy(ctx, id) })
		return id, s
	}

	t.Run("StartListDestroy", func(t *testing.T) {
		id, _ := start(t)
		state(t, id, "running")
		if ids, err := e.Runtime.List(ctx); err != nil || !slices.Contains(ids, id) {
			t.Fatalf("List = %v, %v", ids, err)
		}
		if st, err := e.Runtime.Stats(ctx, id); err != nil || st.MemoryBytes == 0 {
			t.Errorf("Stats = %+v, %v", st, err)
		}
		if err := e.Runtime.SetPidsMax(ctx, id, 64); err != nil {
			t.Errorf("SetPidsMax: %v", err)
		}
		if err := e.Runtime.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		state(t, id, "")
		if ids, _ := e.Runtime.List(ctx); slices.Contains(ids, id) {
			t.Errorf("listed after Destroy: %v", ids)
		}
		if err := e.Runtime.Destroy(ctx, id); err != nil {
			t.Errorf("destroying a sandbox that is gone: %v", err)
		}
	})

	t.Run("PauseResume", func(t *testing.T) {
		id, _ := start(t)
		if err := e.Runtime.Resume(ctx, id); err == nil {
			t.Error("resumed a running sandbox")
		}
		if err := e.Runtime.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		state(t, id, "paused")
		if err := e.Runtime.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		state(t, id, "running")
	})

	t.Run("CheckpointRestore", func(t *testing.T) {
		id, _ := start(t)
		img := t.TempDir()
		if err := e.Runtime.Checkpoint(ctx, id, img, true); err != nil {
			t.Fatal(err)
		}
		state(t, id, "running")
		if _, err := os.Stat(filepath.Join(img, "checkpoint.img")); err != nil {
			t.Fatalf("no checkpoint.img: %v", err)
		}
		// Into a new sandbox, and into a prepared one.
		fresh := rid()
		if err := e.Runtime.Restore(ctx, e.Spec(t, fresh), img, false); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Runtime.Destroy(ctx, fresh) })
		state(t, fresh, "running")
		shell := rid()
		ss := e.Spec(t, shell)
		if err := e.Runtime.Prepare(ctx, ss); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Runtime.Destroy(ctx, shell) })
		state(t, shell, "created")
		if err := e.Runtime.Restore(ctx, ss, img, true); err != nil {
			t.Fatal(err)
		}
		state(t, shell, "running")
		// A paused sandbox checkpoints too, and stays paused.
		if err := e.Runtime.Pause(ctx, fresh); err != nil {
			t.Fatal(err)
		}
		if err := e.Runtime.Checkpoint(ctx, fresh, t.TempDir(), true); err != nil {
			t.Fatalf("checkpoint of a paused sandbox: %v", err)
		}
		state(t, fresh, "paused")
	})

	t.Run("ExportRootfs", func(t *testing.T) {
		id, _ := start(t)
		if err := e.Runtime.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		tar := filepath.Join(t.TempDir(), "upper.tar")
		if err := e.Runtime.ExportRootfs(ctx, id, tar); err != nil {
			t.Fatalf("export of a paused sandbox: %v", err)
		}
		state(t, id, "paused")
		if err := e.Runtime.ExportRootfs(ctx, id, tar); err == nil {
			t.Error("export over an existing file")
		}
		booted := rid()
		s := e.Spec(t, booted)
		s.RootfsUpper = tar
		if err := e.Runtime.Start(ctx, s); err != nil {
			t.Fatalf("start with the exported files: %v", err)
		}
		t.Cleanup(func() { _ = e.Runtime.Destroy(ctx, booted) })
		state(t, booted, "running")
	})

	t.Run("RestoreMissingImage", func(t *testing.T) {
		id := rid()
		if err := e.Runtime.Restore(ctx, e.Spec(t, id), filepath.Join(t.TempDir(), "nothing"), false); err == nil {
			t.Error("restored an image that does not exist")
		}
		_ = e.Runtime.Destroy(ctx, id)
	})

	t.Run("WatchSeesDestroy", func(t *testing.T) {
		id, s := start(t)
		exited := make(chan struct{})
		if err := e.Runtime.Watch(ctx, s.BundleDir, func() { close(exited) }); err != nil {
			t.Fatal(err)
		}
		if err := e.Runtime.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Fatal("Watch did not report the exit")
		}
	})
}
