package integration

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestResumeFromImportedImage: a spilled sandbox's image goes to the
// daemon's chunk store (file:// in its data directory) and leaves the
// disk; the resume imports it (Server-Timing's import phase) and the
// sandbox's REPL variable, files, process and listening socket are as
// they were. (The chunk store's own tests check that an import is the
// exported image byte for byte, holes included.)
func TestResumeFromImportedImage(t *testing.T) {
	sb := create(t, nil)
	st := seed(t, sb, "chunked")
	if r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{"spill": true}); r.status != http.StatusNoContent {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	img := filepath.Join(d.dataDir, "paused", sb.SandboxID)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the paused image %s is still on the disk 30 s after the pause", img)
		}
	}
	r := call(t, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 120})
	if r.status != http.StatusCreated {
		t.Fatalf("resume from the chunk store: %d %s", r.status, r.body)
	}
	if timing := r.header.Get("Server-Timing"); !strings.Contains(timing, "import;") {
		t.Errorf("the resume did not import the image: Server-Timing %q", timing)
	}
	check(t, sb, st)
	if _, err := os.Stat(img); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the imported image is left on the disk after the resume: %v", err)
	}
}
