package layers

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// MaxDepth bounds how many layers one overlay mount stacks. The kernel
// takes a mount's options as one page; lower directories are named
// relative to the store ("<id>/diff", 22 bytes each), which leaves room
// for about 170.
const MaxDepth = 120

// Mount shows lowers (relative to the store: LowerPath, the topmost first)
// with this layer's diff on top, writable, at Merged().
func (p *Pending) Mount(ctx context.Context, lowers []string) error {
	if len(lowers) == 0 {
		return errors.New("an overlay needs at least one lower layer")
	}
	if len(lowers) > MaxDepth {
		return fmt.Errorf("%d layers are more than one build can stack (%d)", len(lowers), MaxDepth)
	}
	rel, err := filepath.Rel(p.s.dir, p.tmp)
	if err != nil {
		return err
	}
	// Copy-up without redirects, metadata-only copies or an index: the
	// upper directory stays a plain tree of whole files that Flatten reads.
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + rel + "/diff,workdir=" + rel +
		"/work,redirect_dir=off,index=off,metacopy=off"
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Run in the store's directory: relative lower paths keep the options
	// within a page.
	cmd := exec.CommandContext(ctx, "mount", "-t", "overlay", "overlay", "-o", opts, rel+"/merged")
	cmd.Dir = p.s.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mounting the build overlay: %v: %s", err, strings.TrimSpace(string(out)))
	}
	p.mounted = true
	return nil
}

// LowerPath names layer id as a lower directory for Mount.
func LowerPath(id string) string { return id + "/diff" }

// Unmount takes the overlay down (a no-op when it is not mounted).
func (p *Pending) Unmount() error {
	if !p.mounted {
		return nil
	}
	if err := unmount(p.Merged()); err != nil {
		return err
	}
	p.mounted = false
	return nil
}

// unmount unmounts path, retrying while it is busy (a sandbox's gofer may
// still be closing its files), then detaching it.
func unmount(path string) error {
	var err error
	for range 50 {
		err = unix.Unmount(path, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if derr := unix.Unmount(path, unix.MNT_DETACH); derr == nil || errors.Is(derr, unix.EINVAL) {
		return nil
	}
	return fmt.Errorf("unmounting %s: %w", path, err)
}

// unmountAll detaches every mount at or below dir, deepest first.
func unmountAll(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mps = append(mps, mp)
		}
	}
	slices.SortFunc(mps, func(a, b string) int { return len(b) - len(a) })
	for _, mp := range mps {
		_ = unix.Unmount(mp, unix.MNT_DETACH)
	}
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
