package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellfork/cellfork/internal/timing"
)

// The sentry's control socket. The runsc CLI reaches a running sandbox
// through it with gVisor's urpc: one JSON call {"method","arg"} over a Unix
// stream socket, files passed alongside as SCM_RIGHTS, one JSON reply
// {"success","err"}. Spawning the CLI (a 100 MB static binary that loads
// the container's state file before it connects) costs about 15 ms per
// call on this host; the call itself costs under 1 ms. Pause, resume and
// snapshots of a running sandbox take the direct path. Methods and fields
// are those of the pinned runsc (runsc/boot/controller.go,
// pkg/sentry/control/state.go); the runtime tests exercise each.
const (
	methodPause    = "containerManager.Pause"
	methodResume   = "containerManager.Resume"
	methodTarUpper = "Fs.TarRootfsUpperLayer"
	// methodCheckpoint is containerManager.Checkpoint as patched by
	// cellfork (patches/gvisor): it replies with the images the checkpoint
	// references, and a file descriptor of each.
	methodCheckpoint = "containerManager.CheckpointImages"
)

// controlSocket finds the sandbox's control socket where runsc puts it:
// the first of these directories it could create it in.
func (r *Runtime) controlSocket(id string) (string, error) {
	for _, dir := range []string{r.cfg.Root, "/var/run", "/run", "/tmp"} {
		p := filepath.Join(dir, "runsc-"+id+".sock")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("sandbox %s has no control socket (not running?)", id)
}

// errNotSent marks a control call that never reached the sentry.
var errNotSent = errors.New("control call not sent")

// control calls method on sandbox id's sentry with arg (and files, in
// order) and waits for its reply, at most until ctx is done.
func (r *Runtime) control(ctx context.Context, id, method string, arg any, files ...*os.File) error {
	_, err := r.controlResult(ctx, id, method, arg, nil, files...)
	return err
}

// controlResult is control that also decodes the method's result into
// result (if not nil) and returns the files the reply carries (the caller
// owns them).
func (r *Runtime) controlResult(ctx context.Context, id, method string, arg, result any, files ...*os.File) ([]*os.File, error) {
	path, err := r.controlSocket(id)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNotSent, err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("%w: connecting to sandbox %s: %w", errNotSent, id, err)
	}
	defer c.Close()
	conn := c.(*net.UnixConn)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()

	msg, err := json.Marshal(struct {
		Method string `json:"method"`
		Arg    any    `json:"arg"`
	}{method, arg})
	if err != nil {
		return nil, err
	}
	var rights []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		rights = unix.UnixRights(fds...)
	}
	n, _, err := conn.WriteMsgUnix(msg, rights, nil)
	if err == nil && n < len(msg) {
		_, err = conn.Write(msg[n:])
	}
	runtime.KeepAlive(files)
	if err != nil {
		// A message cut short does not decode: the sentry did nothing.
		return nil, fmt.Errorf("%w: calling %s on sandbox %s: %w", errNotSent, method, id, err)
	}
	var reply struct {
		Success bool            `json:"success"`
		Err     string          `json:"err"`
		Result  json.RawMessage `json:"result"`
	}
	data, got, err := readReply(conn)
	if err == nil {
		err = json.Unmarshal(data, &reply)
	}
	if err != nil {
		closeAll(got)
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("%s on sandbox %s: no reply: %w", method, id, err)
	}
	if !reply.Success {
		closeAll(got)
		return nil, fmt.Errorf("%s on sandbox %s: %s", method, id, reply.Err)
	}
	if result != nil && len(reply.Result) > 0 {
		if err := json.Unmarshal(reply.Result, result); err != nil {
			closeAll(got)
			return nil, fmt.Errorf("%s on sandbox %s: decoding its result: %w", method, id, err)
		}
	}
	return got, nil
}

// readReply reads one urpc reply: a JSON object, sent in one or more
// writes, the first of which may carry file descriptors (SCM_RIGHTS).
func readReply(conn *net.UnixConn) ([]byte, []*os.File, error) {
	var data []byte
	var files []*os.File
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(128*4))
	for {
		n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
		// A failed read (the sentry died mid-reply: ECONNRESET) may report
		// n = -1.
		n, oobn = max(n, 0), max(oobn, 0)
		if oobn > 0 {
			msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				if fds, ferr := unix.ParseUnixRights(&m); ferr == nil {
					for _, fd := range fds {
						unix.CloseOnExec(fd)
						files = append(files, os.NewFile(uintptr(fd), "urpc-file"))
					}
				}
			}
			if perr != nil && err == nil {
				err = perr
			}
		}
		data = append(data, buf[:n]...)
		if json.Valid(data) {
			return data, files, nil
		}
		if err != nil || n == 0 {
			closeAll(files)
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return nil, nil, err
		}
	}
}

func closeAll(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// Pause marks. runsc's state file does not see a pause made over the
// control socket, and the sentry counts pauses (each needs its resume) but
// does not say whether it is paused. So the runtime records it: "pausing"
// from before a pause until after it returned (then "paused"), and again
// from before a resume until after it returned (then nothing). A
// "pausing" mark left by a crash means the count is unknown.
const (
	markPausing = "pausing"
	markPaused  = "paused"
)

// marksDir holds the pause marks, beside runsc's root (New creates it).
func marksDir(root string) string { return root + ".pause" }

func (r *Runtime) mark(id, kind string) string {
	return filepath.Join(marksDir(r.cfg.Root), id+"."+kind)
}

func (r *Runtime) hasMark(id, kind string) bool {
	_, err := os.Stat(r.mark(id, kind))
	return err == nil
}

func (r *Runtime) clearMarks(id string) {
	_ = os.Remove(r.mark(id, markPausing))
	_ = os.Remove(r.mark(id, markPaused))
}

// pauseTimeout bounds a pause or resume. Neither is cut short by the
// caller going away: the call takes about a millisecond, and one cut short
// leaves the pause count unknown.
const pauseTimeout = 30 * time.Second

// Pause freezes every process of the sandbox; its memory stays in place.
// It returns once nothing runs. If it fails once the call was sent, the
// "pausing" mark stays: whether the sandbox froze is unknown (State says
// sandbox.RuntimeUnsure).
func (r *Runtime) Pause(ctx context.Context, id string) error {
	defer timing.Since(ctx, "pause", time.Now())
	if err := os.WriteFile(r.mark(id, markPausing), nil, 0o600); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
	defer cancel()
	if err := r.control(cctx, id, methodPause, nil); err != nil {
		if errors.Is(err, errNotSent) {
			_ = os.Remove(r.mark(id, markPausing))
		}
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	return os.Rename(r.mark(id, markPausing), r.mark(id, markPaused))
}

// Resume thaws a paused sandbox.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	defer timing.Since(ctx, "resume", time.Now())
	if err := os.Rename(r.mark(id, markPaused), r.mark(id, markPausing)); err != nil {
		if errors.Is(err, os.ErrNotExist) && r.hasMark(id, markPausing) {
			return fmt.Errorf("resuming sandbox %s: an earlier pause or resume was cut short; checkpoint it instead", id)
		}
		return fmt.Errorf("resuming sandbox %s: not paused: %w", id, err)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
	defer cancel()
	if err := r.control(cctx, id, methodResume, nil); err != nil {
		if errors.Is(err, errNotSent) {
			_ = os.Rename(r.mark(id, markPausing), r.mark(id, markPaused))
		}
		return fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	return os.Remove(r.mark(id, markPausing))
}

// checkpoint saves the sandbox into dir, as `runsc checkpoint
// --compression=none [--leave-running]` does: the state, the page metadata
// and the pages each in their own file (page-aligned, so a restore can map
// them). With resume the sandbox goes on as it was; without, it stops. The
// image gets a new id, and the images its memory references become its
// bases (images.go).
func (r *Runtime) checkpoint(ctx context.Context, id, dir string, resume bool) error {
	var files []*os.File
	defer func() { closeAll(files) }()
	for _, name := range []string{"checkpoint.img", "pages_meta.img", "pages.img"} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	imageID := newImageID()
	opts := map[string]any{
		"metadata":        map[string]string{"compression": "none", metaImageID: imageID},
		"have_pages_file": true,
		"Resume":          resume,
	}
	var reply struct {
		Images []string `json:"images"`
	}
	got, err := r.controlResult(ctx, id, methodCheckpoint, opts, &reply, files...)
	if err != nil {
		return err
	}
	defer closeAll(got)
	if len(got) != len(reply.Images) {
		return fmt.Errorf("checkpoint of sandbox %s: %d images named, %d files passed", id, len(reply.Images), len(got))
	}
	return r.keepBases(dir, imageID, reply.Images, got)
}

// ExportRootfs writes the root overlay's upper layer (what the sandbox
// wrote and deleted in its root filesystem) as a tar to path, over the
// control socket, as `runsc tar rootfs-upper` does. The sandbox may be
// running or paused; it goes on as it was.
func (r *Runtime) ExportRootfs(ctx context.Context, id, path string) error {
	defer timing.Since(ctx, "export", time.Now())
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := r.control(ctx, id, methodTarUpper, map[string]string{"ContainerID": id}, f); err != nil {
		_ = os.Remove(path)
		return err
	}
	return f.Sync()
}
