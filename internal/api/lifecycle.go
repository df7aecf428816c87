package api

import (
	"encoding/base64"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/api/apitypes"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// pause freezes a sandbox; 409 if it is paused already (E2B). With
// {"memory": false} it saves only its files (E2B's filesystem-only pause:
// resuming reboots it). With our {"spill": true} its state also goes to
// disk now, freeing its memory, instead of after --spill-after.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	var b apitypes.PauseRequest
	if err := decode(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	req := sandbox.PauseRequest{Spill: apitypes.Value(b.Spill), FilesOnly: b.Memory != nil && !*b.Memory,
		RequireHealthyAgent: apitypes.Value(b.RequireHealthyGuest)}
	if err := s.m.Pause(r.Context(), r.PathValue("id"), req); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// snapshotJSON is E2B's SnapshotInfo plus our tree fields.
func snapshotJSON(sn *sandbox.Snapshot) apitypes.Snapshot {
	b := apitypes.Snapshot{SnapshotID: sn.ID, Names: sn.Names, ParentID: apitypes.Optional(sn.ParentID),
		SandboxID: sn.SandboxID, TemplateID: sn.TemplateID, SizeBytes: sn.SizeBytes, CreatedAt: sn.CreatedAt,
		UploadState: apitypes.Optional(apitypes.SnapshotUploadState(sn.Upload)), StoreRoot: apitypes.Optional(sn.StoreRoot),
		UploadError: apitypes.Optional(sn.UploadError)}
	if b.Names == nil {
		b.Names = []string{}
	}
	return b
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	var b apitypes.SnapshotRequest
	if err := decode(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	err := s.checkTreeName(r.Context(), r.PathValue("id"), apitypes.Value(b.Name))
	var sn *sandbox.Snapshot
	if err == nil {
		sn, err = s.m.Snapshot(r.Context(), r.PathValue("id"), apitypes.Value(b.Name))
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotJSON(sn))
}

// listSnapshots serves E2B's GET /snapshots (filters sandboxID and name,
// paged by X-Next-Token), oldest first.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 100
	if q.Has("limit") { // empty is invalid, not absent
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > 1000 {
			s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "limit must be between 1 and 1000"))
			return
		}
		limit = n
	}
	after := ""
	if v := q.Get("nextToken"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil || !strings.Contains(string(b), ":") {
			s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "invalid nextToken"))
			return
		}
		after = string(b)
	}
	all, err := s.m.ListSnapshots(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	page := []apitypes.Snapshot{}
	for _, sn := range all {
		key := sn.CreatedAt.Format("20060102150405.000000000") + ":" + sn.ID
		if key <= after && after != "" || q.Get("sandboxID") != "" && sn.SandboxID != q.Get("sandboxID") ||
			q.Get("name") != "" && q.Get("name") != sn.ID && !slices.Contains(sn.Names, q.Get("name")) {
			continue
		}
		if len(page) == limit {
			last := all[slices.IndexFunc(all, func(x *sandbox.Snapshot) bool { return x.ID == page[len(page)-1].SnapshotID })]
			w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString(
				[]byte(last.CreatedAt.Format("20060102150405.000000000")+":"+last.ID)))
			break
		}
		page = append(page, snapshotJSON(sn))
	}
	writeJSON(w, http.StatusOK, page)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.m.GetSnapshot(r.Context(), r.PathValue("snapshotID"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotJSON(sn))
}

func (s *Server) snapshotUsage(w http.ResponseWriter, r *http.Request) {
	u, err := s.m.SnapshotUsage(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, apitypes.SnapshotUsage{TotalBytes: u.TotalBytes, CapBytes: u.CapBytes, Count: u.Count})
}

// deleteSnapshot serves E2B's DELETE /templates/{id} for snapshots (and
// our DELETE /snapshots/{id}).
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.m.DeleteSnapshot(r.Context(), r.PathValue("snapshotID")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var b apitypes.ForkRequest
	if err := decode(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	n, timeout := 1, time.Duration(0)
	if b.Count != nil {
		n = *b.Count
	}
	if b.Timeout != nil {
		timeout = time.Duration(*b.Timeout) * time.Second
	}
	results, err := s.m.Fork(r.Context(), r.PathValue("id"), n, timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]apitypes.ForkResult, len(results))
	for i, res := range results {
		if res.Err != nil {
			status, msg := s.errorOf(r, res.Err)
			out[i].Error = &apitypes.ForkError{Code: status, Message: msg}
			continue
		}
		s.created(res.Sandbox)
		sb := s.sandboxJSON(r, res.Sandbox)
		out[i].Sandbox = &sb
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) rollback(w http.ResponseWriter, r *http.Request) {
	var b apitypes.RollbackRequest
	if err := decode(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	if b.SnapshotID == "" {
		s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "snapshotID is required"))
		return
	}
	sb, err := s.m.Rollback(r.Context(), r.PathValue("id"), b.SnapshotID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sandboxJSON(r, sb))
}

// assume serves a gateway's merge across hosts: the child {id} here
// becomes its parent ?parent=, whose row the gateway moved here. Only a
// gateway calls it (a cluster host's calls are all a gateway's).
func (s *Server) assume(w http.ResponseWriter, r *http.Request) {
	if _, ok := sandbox.TeamOf(r.Context()); !ok {
		s.fail(w, r, errdefs.New(errdefs.ErrNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path))
		return
	}
	sb, err := s.m.Assume(r.Context(), r.PathValue("id"), r.URL.Query().Get("parent"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sandboxJSON(r, sb))
}

func (s *Server) merge(w http.ResponseWriter, r *http.Request) {
	var b apitypes.MergeRequest
	if err := decode(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	if b.SandboxID == "" {
		s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "sandboxID (the child to merge) is required"))
		return
	}
	sb, err := s.m.Merge(r.Context(), r.PathValue("id"), b.SandboxID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sandboxJSON(r, sb))
}
