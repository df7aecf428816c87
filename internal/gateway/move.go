package gateway

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/placement"
	"github.com/cellfork/cellfork/internal/timing"
)

// isResume reports whether r resumes a sandbox (E2B's connect and resume).
func isResume(r *http.Request) bool {
	p := strings.TrimPrefix(r.URL.Path, "/v2")
	return r.Method == http.MethodPost && (strings.HasSuffix(p, "/connect") || strings.HasSuffix(p, "/resume"))
}

// away reports whether h cannot resume its paused sandboxes itself: lost,
// not heartbeating, or draining (an operator empties it).
func away(h clusterdb.Host) bool {
	return h.State == "lost" || h.State == "draining" || h.Silent()
}

// resumeElsewhere moves a paused sandbox whose host is away to another
// host of its region, when its image is in the chunk store: its row is
// handed over (compare-and-swap on its host and generation, with the new
// host's memory taken), and the resume is forwarded there; that host
// imports the image and resumes it under the same id and token. It answers
// and returns true, or answers nothing and returns false (the sandbox is
// not such a sandbox: the caller goes on as before).
func (g *Gateway) resumeElsewhere(w http.ResponseWriter, r *http.Request, c caller, id string, from clusterdb.Host) bool {
	db := g.db.Load()
	if db == nil {
		return false
	}
	t0 := time.Now()
	row, err := db.GetSandbox(r.Context(), id)
	if err != nil || row.Team != c.team.ID || row.State != "paused" || row.HostSlot != from.Slot {
		return false
	}
	if row.StoreRoot == "" {
		if from.State == "draining" && !from.Silent() {
			return false // its host is up: it resumes the sandbox itself
		}
		// Its image had not reached the chunk store (an outage, or the
		// host went away mid-upload): only its host has it.
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "sandbox %q is paused on host %d, which is %s, and its image had not reached the chunk store: it resumes when that host is back; retry later",
			id, from.Slot, hostState(from)))
		return true
	}
	req := placement.Request{Region: row.Region, MemoryMB: int64(row.MemoryMB), Versions: []string{"runsc=" + row.Runtime},
		Exclude: map[int]bool{from.Slot: true}}
	cands, reasons := g.view.Load().table.Choose(req, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
	timing.Since(r.Context(), "place", t0)
	if len(cands) == 0 {
		api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "sandbox %q is paused on host %d, which is %s, and no other host can resume it: %s; retry later",
			id, from.Slot, hostState(from), reasons))
		return true
	}
	for _, h := range cands {
		err := db.Move(r.Context(), id, from.Slot, row.Generation, h.Slot, placement.Reserve)
		switch {
		case errors.Is(err, clusterdb.ErrNoCapacity):
			continue
		case errors.Is(err, clusterdb.ErrStale):
			api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "sandbox %q changed while it was being moved off its host; retry", id))
			return true
		case err != nil:
			api.Fail(g.log, w, r, err)
			return true
		}
		g.setMoved(id, h.Slot)
		g.log.Info("paused sandbox moved", "sandbox.id", id, "from", from.Slot, "to", h.Slot, "why", hostState(from))
		timing.Since(r.Context(), "move", t0)
		g.forward(w, r, toHost(h.Addr, c.team.ID, ""), g.withDomain(r.Host))
		return true
	}
	api.Fail(g.log, w, r, errdefs.New(errdefs.ErrUnavailable, "sandbox %q is paused on host %d, which is %s, and no other host has room to resume it; retry later",
		id, from.Slot, hostState(from)))
	return true
}

func hostState(h clusterdb.Host) string {
	if h.State == "active" {
		return "not heartbeating"
	}
	return h.State
}
