package fake

import (
	"path/filepath"
	"testing"

	"github.com/cellfork/cellfork/internal/runtime/runtimetest"
	"github.com/cellfork/cellfork/internal/sandbox"
)

func TestConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Env {
		h := New()
		return runtimetest.Env{Runtime: h, Spec: func(t *testing.T, rid string) sandbox.Spec {
			return sandbox.Spec{RuntimeID: rid, BundleDir: filepath.Join(t.TempDir(), rid), Rootfs: "/",
				Limits: sandbox.Limits{CPUCount: 1, MemoryMB: 256, PidsMax: 100, OpenFiles: 1024}}
		}}
	})
}
