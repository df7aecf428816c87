package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/timing"
)

// mergeAcross merges a fork child that lives on another host than its
// parent (a fork that overflowed the parent's host), moving no bytes: the
// parent's row is handed to the child's host (a compare-and-swap on its
// host and generation), whose child takes the parent's id, token and
// settings with its own state (POST /sandboxes/{child}/assume there); the
// parent's old host then drops its copy. If the child's host refuses, the
// row is handed back. It answers and returns true, or answers nothing and
// returns false when both live on one host (the caller forwards the merge
// to it). The request's body is restored for the caller.
func (g *Gateway) mergeAcross(w http.ResponseWriter, r *http.Request, c caller, parentID string, from clusterdb.Host) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrInvalidArgument, "reading request body: %v", err))
		return true
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var b struct {
		SandboxID string `json:"sandboxID"`
	}
	if json.Unmarshal(body, &b) != nil || b.SandboxID == "" || b.SandboxID == parentID {
		return false // the host words the refusal
	}
	to, err := g.hostOf(b.SandboxID)
	if err != nil || to.Slot == from.Slot {
		return false
	}
	t0 := time.Now()
	db := g.db.Load()
	if db == nil {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later"))
		return true
	}
	parent, err := db.GetSandbox(r.Context(), parentID)
	if err == nil && parent.Team != c.team.ID {
		err = errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", parentID)
	}
	if err != nil {
		api.Fail(g.log, w, r, err)
		return true
	}
	child, err := db.GetSandbox(r.Context(), b.SandboxID)
	if err == nil && child.Team != c.team.ID {
		err = errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", b.SandboxID)
	}
	if err != nil {
		api.Fail(g.log, w, r, err)
		return true
	}
	if parent.State != "running" || child.State != "running" || parent.HostSlot != from.Slot || child.HostSlot != to.Slot {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrFailedPrecondition, "both sandboxes must be running to merge (%s into %s)", b.SandboxID, parentID))
		return true
	}
	if to.State == "lost" || to.Silent() {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "the child's host (slot %d) does not answer; retry later", to.Slot))
		return true
	}
	switch err := db.Hand(r.Context(), parentID, from.Slot, parent.Generation, to.Slot); {
	case errors.Is(err, clusterdb.ErrStale):
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %q changed while it was being merged; retry", parentID))
		return true
	case err != nil:
		api.Fail(g.log, w, r, err)
		return true
	}
	g.setMoved(parentID, to.Slot)
	timing.Since(r.Context(), "move", t0)
	t1 := time.Now()
	status, answer, err := g.callHost(r.Context(), to, c.team.ID, http.MethodPost,
		"/sandboxes/"+url.PathEscape(b.SandboxID)+"/assume?parent="+url.QueryEscape(parentID), nil)
	timing.Since(r.Context(), "assume", t1)
	if err != nil || status != http.StatusOK {
		// The parent goes back to its host, which never dropped it unless
		// it wrote its row meanwhile.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
		defer cancel()
		if herr := db.Hand(ctx, parentID, to.Slot, parent.Generation+1, from.Slot); herr != nil {
			g.log.Error("handing a sandbox back after a failed merge across hosts", "sandbox.id", parentID, "err", herr)
		} else {
			g.setMoved(parentID, from.Slot)
		}
		if err != nil {
			api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "the child's host did not answer the merge: %v; retry", err))
			return true
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(answer)
		return true
	}
	// The parent's old host drops its copy when it next writes its row;
	// a kill frees it now (its row is the new host's: the kill leaves it).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer cancel()
	if st, body, err := g.callHost(ctx, from, c.team.ID, http.MethodDelete, "/sandboxes/"+url.PathEscape(parentID), nil); err != nil || st/100 != 2 && st != http.StatusNotFound {
		g.log.Warn("the parent's old host did not drop its copy after a merge across hosts (it will when it next writes the row)",
			"sandbox.id", parentID, "host", from.Slot, "status", st, "body", string(body), "err", err)
	}
	g.log.Info("sandbox merged across hosts", "sandbox.id", parentID, "child", b.SandboxID, "from", from.Slot, "to", to.Slot)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(g.domainIn(answer, r.Host))
	return true
}
