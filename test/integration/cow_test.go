package integration

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// Copy-on-write images (patches/gvisor: image-cow): every sandbox restored
// from one image maps the image's pages shared and read-only and copies a
// page only when it writes it. These tests check that isolation stays
// exact: a page a sandbox writes is never visible to its parent, a
// sibling, or a later restore of the same image.

// memState is set up in a sandbox's REPL: buf, 16 MiB of private memory
// (0xa5); pm, a private anonymous mapping (0x77); shm, a MAP_SHARED
// anonymous mapping (0x11) that a forked watcher process shares and
// reports (its first and last byte, hex) in /tmp/shmview.
const memState = `
import ctypes, mmap, os, time
N = 16 << 20
buf = bytearray(b'\xa5') * N
baddr = ctypes.addressof((ctypes.c_char * N).from_buffer(buf))
pm = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE)
pm[:] = b'\x77' * len(pm)
shm = mmap.mmap(-1, 1 << 20)
shm[:] = b'\x11' * len(shm)
if os.fork() == 0:
    os.setsid()
    while True:
        with open('/tmp/shmview.tmp', 'w') as f:
            f.write(shm[:1].hex() + shm[-1:].hex())
        os.replace('/tmp/shmview.tmp', '/tmp/shmview')
        time.sleep(0.02)
print('ok')
`

// filled reports whether buf holds only byte v, at the address it had.
func filled(t *testing.T, sb sandboxInfo, v byte) bool {
	t.Helper()
	out := stdoutOf(runCode(t, sb, fmt.Sprintf(
		"print(buf.count(bytes([%d])) == N and ctypes.addressof((ctypes.c_char * N).from_buffer(buf)) == baddr)", v)))
	return out == "True\n"
}

// fill overwrites buf with v in place.
func fill(t *testing.T, sb sandboxInfo, v byte) {
	t.Helper()
	if out := stdoutOf(runCode(t, sb, fmt.Sprintf("buf[:] = bytes([%d]) * N\nprint('ok')", v))); out != "ok\n" {
		t.Fatalf("%s: writing buf: %q", sb.SandboxID, out)
	}
}

func shmView(t *testing.T, sb sandboxInfo) string {
	t.Helper()
	out, _, _ := run(t, sb, "", "cat /tmp/shmview")
	return out
}

// writeSameAddresses has each of kids (restored from the parent's image,
// which filled its buffer with 0xa5) start with the parent's memory and
// write its own value at the same addresses, and the parent write 0xb0;
// then checks that each reads only its own writes, and that a later
// restore of snap sees the image, not the writes. It returns how many
// children kept their writes, whether the parent did, the later restore
// and whether it was clean.
func writeSameAddresses(t *testing.T, parent sandboxInfo, snap string, kids []sandboxInfo) (own int, parentOwn bool, later sandboxInfo, laterClean bool) {
	t.Helper()
	for i, kid := range kids {
		if !filled(t, kid, 0xa5) {
			t.Fatalf("child %d does not start with the parent's memory", i)
		}
		fill(t, kid, byte(i+1))
	}
	fill(t, parent, 0xb0)
	for i, kid := range kids {
		if filled(t, kid, byte(i+1)) {
			own++
		} else {
			t.Errorf("child %d lost its own writes (a sibling's or the parent's showed through)", i)
		}
	}
	parentOwn = filled(t, parent, 0xb0)
	if !parentOwn {
		t.Errorf("the parent sees a child's write")
	}
	later = create(t, map[string]any{"templateID": snap})
	if laterClean = filled(t, later, 0xa5); !laterClean {
		t.Errorf("a later restore of the snapshot sees writes made after it")
	}
	return own, parentOwn, later, laterClean
}

// forkN forks n children of parent and returns them (killed at cleanup).
func forkN(t *testing.T, parent sandboxInfo, n int) []sandboxInfo {
	t.Helper()
	r := call(t, "POST", "/sandboxes/"+parent.SandboxID+"/fork", map[string]any{"count": n, "timeout": 300})
	if r.status != http.StatusCreated {
		t.Fatalf("fork: %d %s", r.status, r.body)
	}
	var results []struct {
		Sandbox *sandboxInfo `json:"sandbox"`
		Error   any          `json:"error"`
	}
	r.json(t, &results)
	var kids []sandboxInfo
	for _, res := range results {
		if res.Sandbox == nil {
			t.Fatalf("a child failed: %v", res.Error)
		}
		kid := *res.Sandbox
		t.Cleanup(func() { killQuietly(kid.SandboxID) })
		kids = append(kids, kid)
	}
	return kids
}

func snapshotSize(t *testing.T, id string) int64 {
	t.Helper()
	var sn struct {
		SizeBytes int64 `json:"sizeBytes"`
	}
	r := call(t, "GET", "/snapshots/"+id, nil)
	if r.status != 200 {
		t.Fatalf("get snapshot %s: %d %s", id, r.status, r.body)
	}
	r.json(t, &sn)
	return sn.SizeBytes
}

func TestCopyOnWriteIsolation(t *testing.T) {
	parent := create(t, nil)
	if out := stdoutOf(runCode(t, parent, memState)); out != "ok\n" {
		t.Fatalf("setting up memory: %q", out)
	}
	eventually(t, 10*time.Second, "the shared-memory watcher", func() bool { return shmView(t, parent) == "1111" })
	snap := snapshotOf(t, parent.SandboxID, "")

	// Children of one fork image (deleted once the fork returns) and of one
	// snapshot, all writing the same addresses with their own values.
	kids := forkN(t, parent, 4)
	kids = append(kids, create(t, map[string]any{"templateID": snap}), create(t, map[string]any{"templateID": snap}))
	own, parentOwn, later, laterClean := writeSameAddresses(t, parent, snap, kids)
	record("shared memory images", fmt.Sprintf("%d sandboxes restored from one image (fork and snapshot) write 16 MiB at the same addresses", len(kids)),
		"each reads only its own writes; the parent and a later restore read theirs",
		fmt.Sprintf("%d of %d children, parent %v, later restore %v", own, len(kids), parentOwn, laterClean),
		own == len(kids) && parentOwn && laterClean)

	t.Run("fork() inside the sandbox", func(t *testing.T) {
		kid := kids[0]
		out := stdoutOf(runCode(t, kid, `
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    seen = buf.count(bytes([1])) == N
    buf[:] = b'\xcc' * N
    os.write(w, b'1' if seen and buf.count(b'\xcc') == N else b'0')
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 1).decode(), buf.count(bytes([1])) == N)`))
		if out != "1 True\n" {
			t.Errorf("fork() in a child sandbox: %q, want the process's child to see and change only its own copy", out)
		}
		record("shared memory images", "fork() inside a restored sandbox, the child process overwrites memory the image backs",
			"the child sees and changes only its own copy", out, out == "1 True\n")
	})

	t.Run("MAP_SHARED between processes of one sandbox", func(t *testing.T) {
		kid := kids[1]
		runCode(t, kid, "shm[:] = b'\\x22' * len(shm)")
		eventually(t, 10*time.Second, "the watcher process to see the REPL's write", func() bool { return shmView(t, kid) == "2222" })
		time.Sleep(200 * time.Millisecond)
		leaked := 0
		for _, other := range []sandboxInfo{parent, kids[2], later} {
			if v := shmView(t, other); v != "1111" {
				leaked++
				t.Errorf("%s sees %q in its shared memory: another sandbox's write leaked", other.SandboxID, v)
			}
		}
		record("shared memory images", "MAP_SHARED memory written by one process of a restored sandbox",
			"its other process sees it; no other sandbox does", fmt.Sprintf("seen by 3 other sandboxes: %d", leaked), leaked == 0)
	})

	t.Run("memory freed and reused", func(t *testing.T) {
		kid := kids[2]
		out := stdoutOf(runCode(t, kid, `
pm.madvise(mmap.MADV_DONTNEED, 0, 1 << 20)
dropped = pm[:1 << 20].count(0) == 1 << 20 and pm[1 << 20:].count(0x77) == len(pm) - (1 << 20)
addr, size = ctypes.addressof(ctypes.c_char.from_buffer(pm)), len(pm)
pm.close()
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
got = libc.mmap(addr, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x10, -1, 0)
reused = got == addr
fresh = ctypes.string_at(addr, size).count(0) == size
print(dropped, fresh, reused)`))
		if out != "True True True\n" {
			t.Errorf("dropped, fresh, reused = %q: freed image memory must read zeroes when dropped or mapped again", out)
		}
		record("shared memory images", "memory the image backs dropped (MADV_DONTNEED), unmapped and mapped again at the same address",
			"zeroes, never the image's contents", out, out == "True True True\n")
	})

	t.Run("image deleted while children run", func(t *testing.T) {
		// The fork image went when the fork returned; the snapshot goes now.
		if r := call(t, "DELETE", "/templates/"+snap, nil); r.status != http.StatusNoContent {
			t.Fatalf("delete snapshot: %d %s", r.status, r.body)
		}
		for i, kid := range kids[3:] {
			if !filled(t, kid, byte(i+4)) {
				t.Errorf("child %d lost its memory when its image was deleted", i+3)
			}
		}
		if !filled(t, later, 0xa5) {
			t.Errorf("a sandbox restored from the deleted snapshot lost its memory")
		}
		// A snapshot of a child of a deleted image, restored: its base goes
		// with it.
		for _, src := range []sandboxInfo{kids[3], kids[5]} {
			sn := snapshotOf(t, src.SandboxID, "")
			again := create(t, map[string]any{"templateID": sn})
			want := byte(4)
			if src == kids[5] {
				want = 6
			}
			if !filled(t, again, want) {
				t.Errorf("snapshot of %s (image deleted) restores the wrong memory", src.SandboxID)
			}
		}
	})

	t.Run("diff snapshot", func(t *testing.T) {
		// A sandbox restored from a snapshot and barely changed stores only
		// what it changed.
		base := snapshotOf(t, parent.SandboxID, "")
		sb := create(t, map[string]any{"templateID": base})
		runCode(t, sb, "small = 1")
		diff := snapshotOf(t, sb.SandboxID, "")
		full, part := snapshotSize(t, base), snapshotSize(t, diff)
		t.Logf("snapshot %d bytes; snapshot of a sandbox restored from it %d bytes", full, part)
		if part*4 > full {
			t.Errorf("the diff snapshot is %d bytes, more than a quarter of the %d-byte snapshot it came from", part, full)
		}
		again := create(t, map[string]any{"templateID": diff})
		if out := stdoutOf(runCode(t, again, "print(small, buf.count(bytes([0xb0])) == N)")); out != "1 True\n" {
			t.Errorf("restoring the diff snapshot: %q", out)
		}
	})
}

// TestSmallDiffIsolation is TestCopyOnWriteIsolation for a diff image small
// enough that a restore loads all its own pages instead of mapping them
// (patches/gvisor: diff-prefetch, up to 16 MiB): a parent restored from the
// warm image that wrote 1 MiB; its fork children and the sandboxes created
// from its snapshot write the same addresses.
func TestSmallDiffIsolation(t *testing.T) {
	parent := create(t, nil)
	const small = `
import ctypes
N = 1 << 20
buf = bytearray(b'\xa5') * N
baddr = ctypes.addressof((ctypes.c_char * N).from_buffer(buf))
print('ok')
`
	if out := stdoutOf(runCode(t, parent, small)); out != "ok\n" {
		t.Fatalf("setting up memory: %q", out)
	}
	snap := snapshotOf(t, parent.SandboxID, "")
	if size := snapshotSize(t, snap); size > 16<<20 {
		t.Fatalf("the parent's snapshot is %d bytes: not a small diff", size)
	}
	kids := forkN(t, parent, 2)
	kids = append(kids, create(t, map[string]any{"templateID": snap}), create(t, map[string]any{"templateID": snap}))
	own, parentOwn, _, laterClean := writeSameAddresses(t, parent, snap, kids)
	// A diff of a diff: a child's snapshot, restored, has the child's memory.
	again := create(t, map[string]any{"templateID": snapshotOf(t, kids[2].SandboxID, "")})
	chained := filled(t, again, 3)
	if !chained {
		t.Errorf("a snapshot of a sandbox created from the small diff restores the wrong memory")
	}
	record("shared memory images", fmt.Sprintf("%d sandboxes restored from one small diff image (its pages loaded, not mapped) write the same addresses", len(kids)),
		"each reads only its own writes; the parent, a later restore and a diff of a diff read theirs",
		fmt.Sprintf("%d of %d children, parent %v, later restore %v, diff of a diff %v", own, len(kids), parentOwn, laterClean, chained),
		own == len(kids) && parentOwn && laterClean && chained)
}

// imageDocs sums up, in a sandbox's REPL, the docstrings of the modules the
// warm image holds (strings in its memory since the image was taken): how
// many, and a digest of their contents.
const imageDocs = `
import sys, ctypes, hashlib
def image_docs():
    return [d for _, d in sorted((n, getattr(m, '__doc__', None)) for n, m in list(sys.modules.items()))
            if type(d) is str and d.isascii() and ' ' in d and len(d) > 20]
def docs_digest():
    ds = image_docs()
    return '%d %s' % (len(ds), hashlib.sha256('\0'.join(ds).encode()).hexdigest())
print(docs_digest())
`

// overwriteDocs overwrites those docstrings in place with 'Z's: writes
// into pages of the image that the sandbox's restore mapped, many of them
// before any request (patches/gvisor: premap).
const overwriteDocs = `
n = 0
for d in image_docs():
    ctypes.memset(id(d) + sys.getsizeof(d) - len(d) - 1, ord('Z'), len(d))
    n += len(d)
print(n, all(set(d) == {'Z'} for d in image_docs()))
`

// TestPremapIsolation: a pooled sandbox's restore maps, before its first
// request, the image's memory that the warm image's first request touched
// (patches/gvisor: premap). Writes to that memory stay the sandbox's own:
// a sandbox that writes over strings of the image sees its writes, and a
// sibling restored before the writes and a sandbox restored after them see
// the image.
func TestPremapIsolation(t *testing.T) {
	pooled := func() sandboxInfo {
		t.Helper()
		waitPool(t)
		sb, mode := createMode(t, nil)
		if mode != "pool" {
			t.Fatalf("%s: bootMode %q, want a pooled sandbox", sb.SandboxID, mode)
		}
		return sb
	}
	sibling := pooled()
	writer := pooled()
	image := stdoutOf(runCode(t, sibling, imageDocs))
	var n int
	if _, err := fmt.Sscanf(image, "%d ", &n); err != nil || n < 20 {
		t.Fatalf("the image's docstrings: %q", image)
	}
	if got := stdoutOf(runCode(t, writer, imageDocs)); got != image {
		t.Fatalf("two restores of one image differ before any write: %q, %q", got, image)
	}
	out := stdoutOf(runCode(t, writer, overwriteDocs))
	var written int
	var all string
	if _, err := fmt.Sscanf(out, "%d %s", &written, &all); err != nil || written < 20*n || all != "True" {
		t.Fatalf("overwriting the docstrings: %q", out)
	}
	t.Logf("%d docstrings of the image, %d bytes overwritten", n, written)
	if got := stdoutOf(runCode(t, writer, "print(docs_digest())")); got == image {
		t.Fatalf("the writer does not see its writes: %q", got)
	}
	if got := stdoutOf(runCode(t, sibling, "print(docs_digest())")); got != image {
		t.Errorf("a sibling sees the writer's writes: %q, want %q", got, image)
	}
	// Sandboxes restored after the writes (the pool refilled meanwhile).
	for i := 0; i < 3; i++ {
		later := pooled()
		if got := stdoutOf(runCode(t, later, imageDocs)); got != image {
			t.Errorf("a later restore sees the writer's writes: %q, want %q", got, image)
		}
		killQuietly(later.SandboxID)
	}
}

// TestPremapInheritIsolation is TestPremapIsolation for diff images: a fork
// child's or a snapshot's restore maps, before its first request, the
// memory that the warm image's first request touched, with the fault
// ranges its parent was restored with (patches/gvisor: premap-inherit). A
// child that writes over strings of the warm image sees its writes; its
// sibling, its parent, a sandbox created from the parent's snapshot before
// the writes and one after see the image; a sandbox created from the
// writer's snapshot (a diff of a diff) sees the writes.
func TestPremapInheritIsolation(t *testing.T) {
	waitPool(t)
	parent, mode := createMode(t, nil)
	if mode != "pool" {
		t.Fatalf("%s: bootMode %q, want a pooled sandbox", parent.SandboxID, mode)
	}
	image := stdoutOf(runCode(t, parent, imageDocs))
	var n int
	if _, err := fmt.Sscanf(image, "%d ", &n); err != nil || n < 20 {
		t.Fatalf("the image's docstrings: %q", image)
	}
	snap := snapshotOf(t, parent.SandboxID, "")
	before := create(t, map[string]any{"templateID": snap})
	kids := forkN(t, parent, 2)
	writer, sibling := kids[0], kids[1]
	for _, sb := range []sandboxInfo{writer, sibling, before} {
		if got := stdoutOf(runCode(t, sb, "print(docs_digest())")); got != image {
			t.Fatalf("%s does not start with the parent's memory: %q, want %q", sb.SandboxID, got, image)
		}
	}
	out := stdoutOf(runCode(t, writer, overwriteDocs))
	var written int
	var all string
	if _, err := fmt.Sscanf(out, "%d %s", &written, &all); err != nil || written < 20*n || all != "True" {
		t.Fatalf("overwriting the docstrings: %q", out)
	}
	written2 := stdoutOf(runCode(t, writer, "print(docs_digest())"))
	if written2 == image {
		t.Fatalf("the writer does not see its writes: %q", written2)
	}
	for name, sb := range map[string]sandboxInfo{"its sibling": sibling, "its parent": parent, "a sandbox created from the parent's snapshot before": before} {
		if got := stdoutOf(runCode(t, sb, "print(docs_digest())")); got != image {
			t.Errorf("%s sees the writer's writes: %q, want %q", name, got, image)
		}
	}
	after := create(t, map[string]any{"templateID": snap})
	if got := stdoutOf(runCode(t, after, "print(docs_digest())")); got != image {
		t.Errorf("a sandbox created from the parent's snapshot after the writes sees them: %q, want %q", got, image)
	}
	chained := create(t, map[string]any{"templateID": snapshotOf(t, writer.SandboxID, "")})
	if got := stdoutOf(runCode(t, chained, "print(docs_digest())")); got != written2 {
		t.Errorf("a sandbox created from the writer's snapshot does not see its writes: %q, want %q", got, written2)
	}
}
