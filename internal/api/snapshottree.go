package api

import (
	"context"
	"net/http"

	"github.com/cellfork/cellfork/internal/api/apitypes"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// snapshotTree serves GET /snapshots/tree (ours): every snapshot, arranged
// in trees by parent. Clients draw it as is; it is built here only.
func (s *Server) snapshotTree(w http.ResponseWriter, r *http.Request) {
	all, err := s.m.ListSnapshots(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotForest(all))
}

// snapshotForest arranges snapshots into trees by ParentID, keeping their
// order (oldest first) at every level. A snapshot whose parent is not among
// them is a root. Parent links that form a cycle, which the manager never
// makes, are cut: each snapshot of the cycle is a root. So every snapshot
// appears exactly once.
func snapshotForest(all []*sandbox.Snapshot) []apitypes.SnapshotNode {
	byID := make(map[string]*sandbox.Snapshot, len(all))
	var order []*sandbox.Snapshot
	for _, sn := range all {
		if byID[sn.ID] == nil {
			byID[sn.ID] = sn
			order = append(order, sn)
		}
	}
	// inCycle reports whether following parents from sn leads back to it.
	inCycle := func(sn *sandbox.Snapshot) bool {
		seen := map[string]bool{}
		for p := byID[sn.ParentID]; p != nil && !seen[p.ID]; p = byID[p.ParentID] {
			if p.ID == sn.ID {
				return true
			}
			seen[p.ID] = true
		}
		return false
	}
	children := map[string][]*sandbox.Snapshot{}
	var roots []*sandbox.Snapshot
	for _, sn := range order {
		if byID[sn.ParentID] == nil || inCycle(sn) {
			roots = append(roots, sn)
		} else {
			children[sn.ParentID] = append(children[sn.ParentID], sn)
		}
	}
	var nodes func([]*sandbox.Snapshot) []apitypes.SnapshotNode
	nodes = func(sns []*sandbox.Snapshot) []apitypes.SnapshotNode {
		out := make([]apitypes.SnapshotNode, 0, len(sns))
		for _, sn := range sns {
			b := snapshotJSON(sn)
			out = append(out, apitypes.SnapshotNode{SnapshotID: b.SnapshotID, Names: b.Names, ParentID: b.ParentID,
				SandboxID: b.SandboxID, TemplateID: b.TemplateID, SizeBytes: b.SizeBytes, CreatedAt: b.CreatedAt,
				UploadState: (*apitypes.SnapshotNodeUploadState)(b.UploadState), StoreRoot: b.StoreRoot, UploadError: b.UploadError,
				Children: nodes(children[sn.ID])})
		}
		return out
	}
	return nodes(roots)
}

// checkTreeName refuses the snapshot name "tree": GET /snapshots/tree
// would shadow it (as the manager refuses "usage"). An unknown sandbox is
// still reported first, as for any other name.
func (s *Server) checkTreeName(ctx context.Context, sandboxID, name string) error {
	if name != "tree" {
		return nil
	}
	if _, err := s.m.Get(ctx, sandboxID); err != nil {
		return err
	}
	return errdefs.New(errdefs.ErrInvalidArgument, "snapshot name %q is reserved", name)
}
