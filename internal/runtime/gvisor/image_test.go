package gvisor

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// writeStateHeader writes a checkpoint.img that holds only gVisor's
// statefile header with meta.
func writeStateHeader(t *testing.T, dir string, meta map[string]string) {
	t.Helper()
	b, _ := json.Marshal(meta)
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	data := append(append(append([]byte{}, stateMagic...), n[:]...), b...)
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), append(data, "kernel state"...), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCheckImageBuild(t *testing.T) {
	r := &Runtime{build: "v1+cellfork.aaaa"}
	dir := t.TempDir()
	writeStateHeader(t, dir, map[string]string{"runsc_version": "v1+cellfork.aaaa", "compression": "none"})
	if err := r.checkImageBuild(dir); err != nil {
		t.Fatalf("same build refused: %v", err)
	}
	for _, v := range []string{"v1+cellfork.bbbb", "VERSION_MISSING", ""} {
		writeStateHeader(t, dir, map[string]string{"runsc_version": v})
		err := r.checkImageBuild(dir)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(errdefs.UserMessage(err), "v1+cellfork.aaaa") {
			t.Fatalf("image of build %q: err = %v, want a failed precondition naming both builds", v, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("not a state file at all"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.checkImageBuild(dir); err == nil || !strings.Contains(err.Error(), "not a gVisor state file") {
		t.Fatalf("garbage accepted: %v", err)
	}
	if err := r.checkImageBuild(t.TempDir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing image: %v", err)
	}
}
