package gvisor

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// A checkpoint image's state file (checkpoint.img) starts with gVisor's
// statefile header: a magic string, the length of the metadata (8 bytes,
// big-endian) and the metadata, a JSON object of strings
// (pkg/state/statefile). runsc keeps the version of the runsc that wrote
// the image there.
var stateMagic = []byte("gVisorSF")

const (
	metaRunscVersion = "runsc_version" // runsc/boot/restore.go: VersionKey
	maxMetadata      = 16 << 20
)

// imageMetadata reads the metadata of the checkpoint image in dir.
func imageMetadata(dir string) (map[string]string, error) {
	f, err := os.Open(filepath.Join(dir, "checkpoint.img"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var head [16]byte
	if _, err := io.ReadFull(f, head[:]); err != nil {
		return nil, fmt.Errorf("reading the header of %s: %w", f.Name(), err)
	}
	if !bytes.Equal(head[:8], stateMagic) {
		return nil, fmt.Errorf("%s is not a gVisor state file", f.Name())
	}
	n := binary.BigEndian.Uint64(head[8:])
	if n > maxMetadata {
		return nil, fmt.Errorf("%s: metadata of %d bytes", f.Name(), n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, fmt.Errorf("reading the metadata of %s: %w", f.Name(), err)
	}
	meta := map[string]string{}
	if err := json.Unmarshal(b, &meta); err != nil {
		return nil, fmt.Errorf("parsing the metadata of %s: %w", f.Name(), err)
	}
	return meta, nil
}

// checkImageBuild refuses an image that another build of runsc wrote: the
// sentry's kernel state and page layout are only guaranteed to mean the
// same to the build that wrote them, and our patches change both. (The
// sentry refuses it too, but only after the restore has started, with an
// error the caller cannot act on.)
func (r *Runtime) checkImageBuild(dir string) error {
	meta, err := imageMetadata(dir)
	if err != nil {
		return err
	}
	if got := meta[metaRunscVersion]; got != r.build {
		return errdefs.New(errdefs.ErrFailedPrecondition,
			"image %s was written by runsc %s, and this daemon runs runsc %s: images do not carry over between runsc builds (take the snapshot again)",
			filepath.Base(dir), orUnknown(got), r.build)
	}
	return nil
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

// runscBuild asks runsc for its version: the build id scripts/build-runsc.sh
// stamps it with (gVisor version + cellfork patch set).
func runscBuild(runsc string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := execOutput(ctx, runsc, "--version")
	if err != nil {
		return "", fmt.Errorf("running %s --version: %w", runsc, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	v, ok := strings.CutPrefix(strings.TrimSpace(first), "runsc version ")
	if !ok || v == "" {
		return "", fmt.Errorf("%s --version said %q", runsc, first)
	}
	return v, nil
}
