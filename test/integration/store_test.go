package integration

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
)

// storeSnapshot is the part of a snapshot's JSON the store tests read.
type storeSnapshot struct {
	SnapshotID  string `json:"snapshotID"`
	UploadState string `json:"uploadState"`
	StoreRoot   string `json:"storeRoot"`
	UploadError string `json:"uploadError"`
}

// takeSnapshot snapshots sb and returns the snapshot as answered.
func takeSnapshot(t *testing.T, sb sandboxInfo) storeSnapshot {
	t.Helper()
	r := call(t, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", map[string]any{})
	if r.status != http.StatusCreated {
		t.Fatalf("snapshot: %d %s", r.status, r.body)
	}
	var sn storeSnapshot
	r.json(t, &sn)
	return sn
}

// waitUploaded polls a snapshot until it is uploaded and returns it and
// how long that took from the call.
func waitUploaded(t *testing.T, id string, within time.Duration) (storeSnapshot, time.Duration) {
	t.Helper()
	t0 := time.Now()
	var sn storeSnapshot
	eventually(t, within, "snapshot "+id+" to be uploaded", func() bool {
		r := call(t, "GET", "/snapshots/"+id, nil)
		if r.status != 200 {
			t.Fatalf("get snapshot: %d %s", r.status, r.body)
		}
		r.json(t, &sn)
		if sn.UploadState == "failed" {
			t.Fatalf("upload failed: %s", sn.UploadError)
		}
		return sn.UploadState == "uploaded"
	})
	return sn, time.Since(t0)
}

// createFrom creates a sandbox from a snapshot and returns it and the
// response's Server-Timing import phase (ms; -1 if none).
func createFrom(t *testing.T, snapshot string) (sandboxInfo, float64) {
	t.Helper()
	r := call(t, "POST", "/v2/sandboxes", map[string]any{"templateID": snapshot, "timeout": 120})
	if r.status != http.StatusCreated {
		t.Fatalf("create from %s: %d %s", snapshot, r.status, r.body)
	}
	var sb sandboxInfo
	r.json(t, &sb)
	return sb, timingOf(r.header.Get("Server-Timing"), "import")
}

var timingRE = regexp.MustCompile(`(?:^|,\s*)([^;,]+);dur=([0-9.]+)`)

// timingOf returns a Server-Timing phase's duration in ms, -1 if absent.
func timingOf(header, name string) float64 {
	for _, m := range timingRE.FindAllStringSubmatch(header, -1) {
		if m[1] == name {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	return -1
}

// storeBytes is the bytes of chunks (and manifests) in a file store.
func storeBytes(t *testing.T, dir string) (chunks int, bytes int64) {
	t.Helper()
	for _, sub := range []string{"chunks", "manifests"} {
		_ = filepath.WalkDir(filepath.Join(dir, sub), func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				if info, err := e.Info(); err == nil {
					bytes += info.Size()
					if sub == "chunks" {
						chunks++
					}
				}
			}
			return nil
		})
	}
	return chunks, bytes
}

func killNow(t *testing.T, id string) {
	t.Helper()
	if r := call(t, "DELETE", "/sandboxes/"+id, nil); r.status != http.StatusNoContent {
		t.Fatalf("kill %s: %d %s", id, r.status, r.body)
	}
}

// TestSnapshotThroughFileStore: with the default store (file:// in the
// data directory), a snapshot uploads in the background; once its local
// image is gone (a host that lost it), a create imports it, verified, and
// has the exact state; after one of two snapshots is deleted, collection
// frees its own chunks and keeps the other's; a corrupt chunk is refused,
// never restored; deleting the last snapshot frees the rest.
func TestSnapshotThroughFileStore(t *testing.T) {
	flags := []string{"--store-gc-interval", "1s", "--store-gc-grace", "0s", "--standby-snapshots", "0", "--pool-ready", "0"}
	withDaemon(t, flags, func() {
		store := filepath.Join(d.dataDir, "store")
		sb := create(t, map[string]any{"timeout": 300})
		stA := seed(t, sb, "stored-a")
		a := takeSnapshot(t, sb)
		if a.UploadState != "uploading" {
			t.Errorf("a new snapshot's uploadState = %q, want uploading", a.UploadState)
		}
		a, tookA := waitUploaded(t, a.SnapshotID, 2*time.Minute)
		mutate(t, sb, "stored-b")
		b := takeSnapshot(t, sb)
		b, tookB := waitUploaded(t, b.SnapshotID, 2*time.Minute)
		killNow(t, sb.SandboxID)
		t.Logf("uploaded: first snapshot in %v, second in %v (from the answer, polled)", tookA.Round(time.Millisecond), tookB.Round(time.Millisecond))
		for _, line := range strings.Split(d.logs(), "\n") {
			if strings.Contains(line, "snapshot uploaded") {
				t.Logf("daemon: %s", line[strings.Index(line, "msg="):])
			}
		}
		// B is written over the template's warm image (exported as a
		// base when the daemon noted it): a few KB, not the 80 KB of a
		// manifest listing every chunk.
		if body, err := os.ReadFile(filepath.Join(store, "manifests", b.StoreRoot)); err != nil || !strings.Contains(string(body), `"version":2,`) || len(body) > 32<<10 {
			t.Errorf("snapshot B's manifest: %d bytes, over a base: %v (%v)", len(body), strings.Contains(string(body), `"version":2,`), err)
		} else {
			t.Logf("snapshot B's manifest: %d bytes, over the warm image's", len(body))
		}
		var tree []map[string]any
		call(t, "GET", "/snapshots/tree", nil).json(t, &tree)
		if len(tree) != 1 || tree[0]["uploadState"] != "uploaded" || tree[0]["storeRoot"] != a.StoreRoot {
			t.Errorf("tree: %v", tree)
		}

		// The host loses A's image: a create imports it.
		if err := os.RemoveAll(filepath.Join(d.dataDir, "snapshots", a.SnapshotID)); err != nil {
			t.Fatal(err)
		}
		ca, ms := createFrom(t, a.SnapshotID)
		if ms < 0 {
			t.Error("the create's Server-Timing has no import phase")
		}
		t.Logf("create from snapshot A, imported: import %.1f ms", ms)
		check(t, ca, stA)
		killNow(t, ca.SandboxID)

		// Deleting A and collecting frees A's own chunks, not B's.
		chunks, before := storeBytes(t, store)
		if r := call(t, "DELETE", "/snapshots/"+a.SnapshotID, nil); r.status != http.StatusNoContent {
			t.Fatalf("delete snapshot: %d %s", r.status, r.body)
		}
		var after int64
		eventually(t, 30*time.Second, "collection to free snapshot A's chunks", func() bool {
			var n int
			n, after = storeBytes(t, store)
			return n < chunks
		})
		t.Logf("store: %d chunks, %d bytes with A and B; %d bytes after A was deleted and collected", chunks, before, after)
		if err := os.RemoveAll(filepath.Join(d.dataDir, "snapshots", b.SnapshotID)); err != nil {
			t.Fatal(err)
		}
		cb, _ := createFrom(t, b.SnapshotID)
		stB := state{value: "stored-b", pid: stA.pid}
		check(t, cb, stB)
		// A rollback onto a snapshot whose image is gone imports it too.
		mutate(t, cb, "changed")
		if err := os.RemoveAll(filepath.Join(d.dataDir, "snapshots", b.SnapshotID)); err != nil {
			t.Fatal(err)
		}
		r := call(t, "POST", "/sandboxes/"+cb.SandboxID+"/rollback", map[string]any{"snapshotID": b.SnapshotID})
		if r.status != http.StatusOK || timingOf(r.header.Get("Server-Timing"), "import") < 0 {
			t.Fatalf("rollback onto an imported snapshot: %d %s (Server-Timing %q)", r.status, r.body, r.header.Get("Server-Timing"))
		}
		check(t, cb, stB)
		killNow(t, cb.SandboxID)

		// A corrupt chunk in the store is found and refused.
		if err := os.RemoveAll(filepath.Join(d.dataDir, "snapshots", b.SnapshotID)); err != nil {
			t.Fatal(err)
		}
		corruptOneChunk(t, store, b.StoreRoot)
		r = call(t, "POST", "/v2/sandboxes", map[string]any{"templateID": b.SnapshotID, "timeout": 60})
		if r.status != http.StatusInternalServerError || !strings.Contains(r.errMessage(), "corrupt") {
			t.Errorf("create from a corrupt stored image: %d %s", r.status, r.body)
		}
		if r.status == http.StatusCreated {
			var bad sandboxInfo
			r.json(t, &bad)
			killNow(t, bad.SandboxID)
		}
		if _, err := os.Stat(filepath.Join(d.dataDir, "snapshots", b.SnapshotID)); !os.IsNotExist(err) {
			t.Errorf("a refused import left the image directory: %v", err)
		}

		// Deleting the last snapshot frees everything.
		if r := call(t, "DELETE", "/snapshots/"+b.SnapshotID, nil); r.status != http.StatusNoContent {
			t.Fatalf("delete snapshot: %d %s", r.status, r.body)
		}
		eventually(t, 30*time.Second, "collection to free every chunk", func() bool {
			n, _ := storeBytes(t, store)
			return n == 0
		})
		t.Logf("store: %d bytes freed in all", before)
	})
}

// corruptOneChunk flips a byte of a chunk of the image the manifest root
// names (of its own pages.img), in a file store.
func corruptOneChunk(t *testing.T, store, root string) {
	t.Helper()
	h, err := chunkstore.ParseHash(root)
	if err != nil {
		t.Fatal(err)
	}
	// Read through a store: a manifest over a base is resolved with it.
	s, err := chunkstore.Open(context.Background(), "file://"+store, chunkstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Manifest(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	// A chunk of the image's own pages, not of a base the host holds (an
	// import links those: Options.Immutable).
	inBase := map[chunkstore.Hash]bool{}
	for _, f := range m.Files {
		if strings.HasPrefix(f.Name, "base-") {
			for _, c := range f.Chunks {
				inBase[c.Hash] = true
			}
		}
	}
	var own []chunkstore.Hash
	for _, f := range m.Files {
		for _, c := range f.Chunks {
			if f.Name == "pages.img" && !c.Zero && !inBase[c.Hash] {
				own = append(own, c.Hash)
			}
		}
	}
	if len(own) == 0 {
		t.Fatal("the image has no pages of its own")
	}
	victim := filepath.Join(store, chunkstore.ChunkKey(own[len(own)/2]))
	b, err := os.ReadFile(victim)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(victim, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotThroughS3Store: with an s3:// store (a real S3 server,
// versitygw), an upload waits out the server being down, and the daemon
// being killed meanwhile: its successor resumes it; a host that lost the
// image imports it from S3 with the exact state.
func TestSnapshotThroughS3Store(t *testing.T) {
	srv := chunkstoretest.StartS3(t)
	bucket := srv.NewBucket(t)
	cfg := srv.Config()
	env := []string{"AWS_ENDPOINT_URL_S3=" + srv.Endpoint(), "AWS_ACCESS_KEY_ID=" + cfg.AccessKey, "AWS_SECRET_ACCESS_KEY=" + cfg.SecretKey}
	flags := []string{"--store", "s3://" + bucket + "/cellfork", "--standby-snapshots", "0", "--pool-ready", "0"}
	withDaemonEnv(t, env, flags, func() {
		sb := create(t, map[string]any{"timeout": 300})
		st := seed(t, sb, "via-s3")
		srv.Stop()
		sn := takeSnapshot(t, sb)
		killNow(t, sb.SandboxID)
		time.Sleep(3 * time.Second)
		r := call(t, "GET", "/snapshots/"+sn.SnapshotID, nil)
		r.json(t, &sn)
		if sn.UploadState != "uploading" {
			t.Errorf("with the store down: uploadState %q (%s), want uploading", sn.UploadState, sn.UploadError)
		}
		// The host dies with the upload pending; its successor resumes it
		// once the store is back.
		addr := strings.TrimPrefix(d.url, "http://")
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.exited
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		nd, err := startDaemonEnv(filepath.Join(repoRoot, "bin", "cellfork"), d.dataDir, addr, env, flags...)
		if err != nil {
			t.Fatal(err)
		}
		d = nd
		sn, took := waitUploaded(t, sn.SnapshotID, 3*time.Minute)
		t.Logf("uploaded %v after the restarted daemon came up with the store back", took.Round(time.Millisecond))
		if err := os.RemoveAll(filepath.Join(d.dataDir, "snapshots", sn.SnapshotID)); err != nil {
			t.Fatal(err)
		}
		c, ms := createFrom(t, sn.SnapshotID)
		t.Logf("create from the snapshot, imported from S3 (its chunks in the host cache since the export): import %.1f ms", ms)
		check(t, c, st)
		killNow(t, c.SandboxID)
	})
}
