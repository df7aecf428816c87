package integration

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
)

// TestResumeFromImportedImage sends a spilled sandbox's image through the
// chunk store and back into its place, then resumes the sandbox from it:
// its REPL variable, files, process and listening socket are as they were.
// (gVisor writes no zero pages, so the imported pages.img rarely has a
// hole: the chunk store's own tests check holes on synthetic images.)
func TestResumeFromImportedImage(t *testing.T) {
	sb := create(t, nil)
	st := seed(t, sb, "chunked")
	if r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{"spill": true}); r.status != http.StatusNoContent {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	img := filepath.Join(d.dataDir, "paused", sb.SandboxID)
	b, err := chunkstore.OpenFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := chunkstore.New(b, chunkstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	exp, err := s.Export(ctx, img, map[string]string{"sandbox": sb.SandboxID})
	if err != nil {
		t.Fatal(err)
	}
	orig := filepath.Join(t.TempDir(), "orig")
	if err := os.Rename(img, orig); err != nil {
		t.Fatal(err)
	}
	imp, err := s.Import(ctx, exp.Root, img)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("export %s\nimport %s", &exp, &imp)
	chunkstoretest.Equal(t, orig, img)
	r := call(t, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 120})
	if r.status != http.StatusCreated {
		t.Fatalf("resume from the imported image: %d %s", r.status, r.body)
	}
	check(t, sb, st)
}
