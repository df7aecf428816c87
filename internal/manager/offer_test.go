package manager

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// A snapshot not yet uploaded starts a sandbox on another host whose
// create names the image its host offers (a gateway's fork child): the
// image comes from that host, and the offer's root is the one its upload
// then writes. A peer named for another snapshot, or another team's
// snapshot, is not heeded.
func TestSnapshotOfferedByItsHost(t *testing.T) {
	images := newMemImages()
	release := holdExports(images)
	a := newStoreEnv(t, images)
	offers := newMemImages() // what a's host serves its peers
	b := newEnv(t, nil)
	b.m.Close()
	b.images, b.cluster = &memImages{manifests: map[string]map[string][]byte{}, peer: offers}, otherHost{m: a.m}
	b.start()

	sb := a.create(sandbox.CreateRequest{})
	a.write(sb.ID, "on-a")
	sn, err := a.m.Snapshot(context.Background(), sb.ID, "packed")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.m.SnapshotImage(sandbox.WithTeam(context.Background(), "other"), sn.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another team's snapshot offered: %v", err)
	}
	dir, meta, err := a.m.SnapshotImage(context.Background(), sn.ID)
	if err != nil {
		t.Fatal(err)
	}
	root, _, err := offers.Export(context.Background(), dir, meta)
	if err != nil {
		t.Fatal(err)
	}
	wrong := sandbox.WithImagePeer(context.Background(), sandbox.ImagePeer{Snapshot: "another", Root: root, Addr: "a:3000"})
	if _, err := b.m.Create(wrong, sandbox.CreateRequest{TemplateID: "packed"}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "not in the chunk store yet") {
		t.Fatalf("create naming a peer for another snapshot: %v", err)
	}
	ctx := sandbox.WithImagePeer(context.Background(), sandbox.ImagePeer{Snapshot: "packed", Root: root, Addr: "a:3000"})
	c, err := b.m.Create(ctx, sandbox.CreateRequest{TemplateID: "packed"})
	if err != nil {
		t.Fatalf("create from an offered snapshot: %v", err)
	}
	if got := b.memory(c.ID); got != "on-a" || c.BaseSnapshot != sn.ID {
		t.Errorf("memory %q, base %q", got, c.BaseSnapshot)
	}
	release()
	if up := a.waitUpload(sn.ID, sandbox.UploadDone); up.StoreRoot != root {
		t.Errorf("the upload wrote root %s, the offer %s", up.StoreRoot, root)
	}
}
