package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// forkFirstRoutes adds the snapshot, fork, rollback, merge and pause
// endpoints to the fake daemon. The id "missing" is not found; "partial"
// forks with every second child failing; "paused" is paused already.
func (d *fakeDaemon) forkFirstRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", func(w http.ResponseWriter, r *http.Request) {
		if notFound(w, r) {
			return
		}
		var b struct {
			Name string `json:"name"`
		}
		json.NewDecoder(r.Body).Decode(&b)
		names := []string{}
		if b.Name != "" {
			names = append(names, b.Name)
		}
		writeJSONStatus(w, http.StatusCreated, map[string]any{
			"snapshotID": "snapA", "names": names, "parentID": nil, "sandboxID": r.PathValue("id"),
			"templateID": "base", "sizeBytes": 1536, "createdAt": "2026-08-22T10:00:00.5Z",
		})
	})
	mux.HandleFunc("GET /snapshots", func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		pages := d.snaps
		d.mu.Unlock()
		servePages(w, r, pages)
	})
	mux.HandleFunc("GET /snapshots/tree", func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		tree := d.tree
		d.mu.Unlock()
		io.WriteString(w, tree)
	})
	mux.HandleFunc("GET /snapshots/usage", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"totalBytes":3221225472,"capBytes":21474836480,"count":3}`)
	})
	mux.HandleFunc("GET /snapshots/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "missing" {
			writeError(w, http.StatusNotFound, "snapshot missing not found")
			return
		}
		io.WriteString(w, `{"snapshotID":"snapA","names":["ready","v1"],"parentID":"snapRoot","sandboxID":"sbx1","templateID":"base","sizeBytes":2048,"createdAt":"2026-08-22T10:00:00Z"}`)
	})
	mux.HandleFunc("DELETE /snapshots/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "missing" {
			writeError(w, http.StatusNotFound, "snapshot missing not found")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		if notFound(w, r) {
			return
		}
		var b struct {
			Count int `json:"count"`
		}
		json.NewDecoder(r.Body).Decode(&b)
		out := make([]string, b.Count)
		for i := range out {
			if r.PathValue("id") == "partial" && i%2 == 1 {
				out[i] = `{"error":{"code":503,"message":"no capacity for another sandbox"}}`
				continue
			}
			out[i] = fmt.Sprintf(`{"sandbox":{"templateID":"base","sandboxID":"child%d","clientID":"cellfork","envdVersion":"0.6.13","envdAccessToken":"t","bootMode":"fork"}}`, i+1)
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "["+strings.Join(out, ",")+"]")
	})
	for _, action := range []string{"rollback", "merge"} {
		mux.HandleFunc("POST /sandboxes/{id}/"+action, func(w http.ResponseWriter, r *http.Request) {
			if notFound(w, r) {
				return
			}
			io.WriteString(w, `{"templateID":"base","sandboxID":"`+r.PathValue("id")+`","clientID":"cellfork","envdVersion":"0.6.13","envdAccessToken":"t","bootMode":"restore"}`)
		})
	}
	mux.HandleFunc("POST /sandboxes/{id}/pause", func(w http.ResponseWriter, r *http.Request) {
		if notFound(w, r) {
			return
		}
		if r.PathValue("id") == "paused" {
			writeError(w, http.StatusConflict, `sandbox "paused" is already paused`)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

func notFound(w http.ResponseWriter, r *http.Request) bool {
	if r.PathValue("id") != "missing" {
		return false
	}
	writeError(w, http.StatusNotFound, "sandbox missing not found")
	return true
}

func writeJSONStatus(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
