package store

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// The records every earlier release wrote (testdata/*-v0.json: daemons
// before versioned records) still read, whole; and what this release
// writes reads back the same.
func TestRecordsOfEarlierReleasesRead(t *testing.T) {
	st, err := Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	load := func(table, file string) {
		doc, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.db.Exec(`INSERT INTO `+table+` (id, doc) VALUES ('old', ?)`, strings.TrimSpace(string(doc))); err != nil {
			t.Fatal(err)
		}
	}
	load("sandboxes", "sandbox-v0.json")
	load("snapshots", "snapshot-v0.json")
	t0 := time.Date(2026, 11, 20, 10, 0, 0, 123456789, time.UTC)
	wantSB := &sandbox.Sandbox{ID: "i5q0w8r3m2a7k1x9c4b6", TemplateID: "code-interpreter-v1", RuntimeID: "0a1b2c3d4e5f60718293a4b5",
		State: sandbox.StatePaused, StartedAt: t0, EndAt: t0.Add(time.Hour), Metadata: map[string]string{"user": "ada"},
		Envs: map[string]string{"FOO": "bar"}, CPUCount: 2, MemoryMB: 2048, DiskSizeMB: 1024, PidsMax: 256, OpenFiles: 4096,
		AccessToken: "00112233445566778899aabbccddeeff", OnTimeout: "pause", AutoResume: true,
		Rootfs: "/var/lib/cellfork/templates/base/7a89e37580afabbe/rootfs", ParentID: "p2n7c4x9w1q5m8k3z6b0",
		BaseSnapshot: "snapaaaaaaaaaaaaaaaa", PausedImage: "/var/lib/cellfork/paused/i5q0w8r3m2a7k1x9c4b6", BootMode: "fork",
		Network: sandbox.Network{AllowOut: []string{"pypi.org", "10.0.0.0/8"}, DenyOut: []string{"0.0.0.0/0"},
			DNSServers: []string{"1.1.1.1"}}}
	wantSN := &sandbox.Snapshot{ID: "snapbbbbbbbbbbbbbbbb", Names: []string{"team/child"}, ParentID: "snapaaaaaaaaaaaaaaaa",
		SandboxID: "i5q0w8r3m2a7k1x9c4b6", TemplateID: "base", Rootfs: "/var/lib/cellfork/templates/base/7a89e37580afabbe/rootfs",
		Image: "/var/lib/cellfork/snapshots/snapbbbbbbbbbbbbbbbb", SizeBytes: 67108864, CreatedAt: t0,
		Envs: map[string]string{"FOO": "bar"}, CPUCount: 1, MemoryMB: 1024, DiskMB: 512, PidsMax: 512, OpenFiles: 65536,
		Network: sandbox.Network{AllowInternet: true, AllowPublicTraffic: true}}
	sb, err := st.Get(ctx, "old")
	if err != nil || !reflect.DeepEqual(sb, wantSB) {
		t.Fatalf("v0 sandbox record read as\n%+v, %v\nwant\n%+v", sb, err, wantSB)
	}
	sn, err := st.GetSnapshot(ctx, "old")
	if err != nil || !reflect.DeepEqual(sn, wantSN) {
		t.Fatalf("v0 snapshot record read as\n%+v, %v\nwant\n%+v", sn, err, wantSN)
	}
	// Round trip through this release's records.
	if err := st.Put(ctx, wantSB); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Get(ctx, wantSB.ID); err != nil || !reflect.DeepEqual(got, wantSB) {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	var doc string
	_ = st.db.QueryRow(`SELECT doc FROM sandboxes WHERE id = ?`, wantSB.ID).Scan(&doc)
	if !strings.HasPrefix(doc, `{"v":1,`) {
		t.Errorf("records carry no version: %s", doc)
	}
	// A record from a newer release is refused, not misread.
	if _, err := st.db.Exec(`INSERT INTO sandboxes (id, doc) VALUES ('new', '{"v":99,"ID":"new"}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, "new"); err == nil || !strings.Contains(err.Error(), "newer cellfork") {
		t.Errorf("a version 99 record: %v", err)
	}
}

// Network rules and the request host mask round-trip; records without
// them stay as earlier releases wrote them; the database is the daemon's
// alone (it holds the rules' header values).
func TestNetworkRulesRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	n := sandbox.Network{AllowInternet: true, AllowPublicTraffic: true, MaskRequestHost: "${PORT}-app.example.com",
		Rules: map[string]sandbox.Transform{"api.example.com": {Headers: map[string]string{"Authorization": "Bearer x"}}, "*.example.org": {}}}
	sb := &sandbox.Sandbox{ID: "rules", State: sandbox.StateRunning, Network: n}
	sn := &sandbox.Snapshot{ID: "rulesnap", Network: n}
	if err := st.Put(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := st.PutSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Get(ctx, "rules"); err != nil || !reflect.DeepEqual(got.Network, n) {
		t.Errorf("sandbox network read back as %+v, %v", got.Network, err)
	}
	if got, err := st.GetSnapshot(ctx, "rulesnap"); err != nil || !reflect.DeepEqual(got.Network, n) {
		t.Errorf("snapshot network read back as %+v, %v", got.Network, err)
	}
	if err := st.Put(ctx, &sandbox.Sandbox{ID: "plain", Network: sandbox.DefaultNetwork}); err != nil {
		t.Fatal(err)
	}
	var doc string
	_ = st.db.QueryRow(`SELECT doc FROM sandboxes WHERE id = 'plain'`).Scan(&doc)
	if strings.Contains(doc, "Rules") || strings.Contains(doc, "MaskRequestHost") {
		t.Errorf("a record without rules has their keys: %s", doc)
	}
	for _, f := range []string{path, path + "-wal"} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v (want mode 0600)", f, fi.Mode(), err)
		}
	}
}

// A snapshot's upload state and store root round-trip; a record without
// them (no store, or an earlier release) has none of their keys.
func TestSnapshotUploadRecords(t *testing.T) {
	st, err := Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for _, sn := range []*sandbox.Snapshot{
		{ID: "up", Upload: sandbox.UploadDone, StoreRoot: strings.Repeat("ab", 32)},
		{ID: "bad", Upload: sandbox.UploadFailed, UploadError: "chunk 00ff: corrupt data"},
		{ID: "pending", Upload: sandbox.UploadPending},
	} {
		if err := st.PutSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
		if got, err := st.GetSnapshot(ctx, sn.ID); err != nil || got.Upload != sn.Upload || got.StoreRoot != sn.StoreRoot || got.UploadError != sn.UploadError {
			t.Errorf("%s read back as %+v, %v", sn.ID, got, err)
		}
	}
	if err := st.PutSnapshot(ctx, &sandbox.Snapshot{ID: "plain"}); err != nil {
		t.Fatal(err)
	}
	var doc string
	_ = st.db.QueryRow(`SELECT doc FROM snapshots WHERE id = 'plain'`).Scan(&doc)
	if strings.Contains(doc, "Upload") || strings.Contains(doc, "StoreRoot") {
		t.Errorf("a record without an upload has its keys: %s", doc)
	}
}

// The records this release writes (version 1, every field set) read back
// whole from their golden files (testdata/*-v1.json), and this release
// writes exactly those bytes: a change to the encoding fails here, and
// wants a new version, its migration, and a golden file of its own
// beside these.
func TestRecordsOfThisReleaseRead(t *testing.T) {
	st, err := Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	t0 := time.Date(2026, 11, 27, 9, 30, 0, 987654321, time.UTC)
	n := sandbox.Network{AllowOut: []string{"pypi.org", "10.0.0.0/8"}, DenyOut: []string{"0.0.0.0/0"}, DNSServers: []string{"1.1.1.1"},
		Rules:           map[string]sandbox.Transform{"api.example.com": {Headers: map[string]string{"Authorization": "Bearer x"}}, "*.example.org": {}},
		MaskRequestHost: "${PORT}-app.example.com"}
	wantSB := &sandbox.Sandbox{ID: "h1r7k2m9q4w8x3c6v5b0", Team: "team-a", TemplateID: "code-interpreter-v1", RuntimeID: "9f8e7d6c5b4a39281706f5e4",
		State: sandbox.StatePaused, StartedAt: t0, EndAt: t0.Add(time.Hour), Metadata: map[string]string{"user": "ada"},
		Envs: map[string]string{"FOO": "bar"}, CPUCount: 2, MemoryMB: 2048, DiskSizeMB: 1024, PidsMax: 256, OpenFiles: 4096,
		AccessToken: "ffeeddccbbaa99887766554433221100", OnTimeout: "pause", AutoResume: false, AutoPauseFiles: true,
		Rootfs: "/var/lib/cellfork/templates/base/7a89e37580afabbe/rootfs", ParentID: "p2n7c4x9w1q5m8k3z6b0",
		BaseSnapshot: "snapcccccccccccccccc", PausedImage: "/var/lib/cellfork/paused/h1r7k2m9q4w8x3c6v5b0",
		PausedRoot: strings.Repeat("cd", 32), PauseMode: sandbox.PauseFiles, BootMode: "restore", Network: n}
	wantSN := &sandbox.Snapshot{ID: "snapdddddddddddddddd", Team: "team-a", Names: []string{"team/v1"}, ParentID: "snapcccccccccccccccc",
		SandboxID: "h1r7k2m9q4w8x3c6v5b0", TemplateID: "base", Rootfs: "/var/lib/cellfork/templates/base/7a89e37580afabbe/rootfs",
		Image: "/var/lib/cellfork/snapshots/snapdddddddddddddddd", SizeBytes: 12582912, CreatedAt: t0,
		Envs: map[string]string{"FOO": "bar"}, CPUCount: 1, MemoryMB: 1024, DiskMB: 512, PidsMax: 512, OpenFiles: 65536, Network: n,
		Upload: sandbox.UploadFailed, StoreRoot: strings.Repeat("ef", 32), UploadError: "its image is corrupt",
		Runtime: "v0.0.0-20260905035102-160fafc42237+cellfork.eb428616a75f+base.0123456789abcdef"}
	golden := func(table, file string) []byte {
		t.Helper()
		doc, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		doc = bytes.TrimSpace(doc)
		if _, err := st.db.Exec(`INSERT INTO `+table+` (id, doc) VALUES ('v1', ?)`, string(doc)); err != nil {
			t.Fatal(err)
		}
		return doc
	}
	doc := golden("sandboxes", "sandbox-v1.json")
	if sb, err := st.Get(ctx, "v1"); err != nil || !reflect.DeepEqual(sb, wantSB) {
		t.Errorf("v1 sandbox record read as\n%+v, %v\nwant\n%+v", sb, err, wantSB)
	}
	if enc, err := EncodeSandbox(wantSB); err != nil || !bytes.Equal(enc, doc) {
		t.Errorf("this release writes the sandbox as\n%s\nnot as its golden file\n%s", enc, doc)
	}
	doc = golden("snapshots", "snapshot-v1.json")
	if sn, err := st.GetSnapshot(ctx, "v1"); err != nil || !reflect.DeepEqual(sn, wantSN) {
		t.Errorf("v1 snapshot record read as\n%+v, %v\nwant\n%+v", sn, err, wantSN)
	}
	if enc, err := EncodeSnapshot(wantSN); err != nil || !bytes.Equal(enc, doc) {
		t.Errorf("this release writes the snapshot as\n%s\nnot as its golden file\n%s", enc, doc)
	}
}
