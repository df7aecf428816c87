package manager

import (
	"context"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// uploadMeta is the metadata a snapshot's image is exported with: an
// offer of the image to a peer (SnapshotImage) must encode the same, so
// that its manifest's root is the one the upload writes.
func (m *Manager) uploadMeta(sn *sandbox.Snapshot) map[string]string {
	return map[string]string{"snapshot": sn.ID, "template": sn.TemplateID, "runsc": m.cfg.RuntimeBuild}
}

// SnapshotImage returns the image directory of this host's snapshot id
// (of the context's team) and the metadata its upload exports it with: a
// cluster host offers it to the host of a fork child made elsewhere,
// before the upload. FailedPrecondition when its image is not on this
// host (it went, to be imported back from the store).
func (m *Manager) SnapshotImage(ctx context.Context, id string) (string, map[string]string, error) {
	sn, err := m.findSnapshot(ctx, id)
	if err != nil {
		return "", nil, err
	}
	if sn.Image == "" || !complete(sn.Image) {
		return "", nil, errdefs.New(errdefs.ErrFailedPrecondition, "snapshot %q: its image is not on this host", id)
	}
	return sn.Image, m.uploadMeta(sn), nil
}
