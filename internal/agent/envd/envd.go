// Package envd is the envd half of the in-sandbox agent: the Connect
// services process.Process and filesystem.Filesystem, and the plain HTTP
// endpoints /health, /files, /init, /envs and /metrics, wire-compatible with
// E2B envd 0.6.x (see /work/shared/spec/e2b-compat.md §4).
//
// The agent runs as root; every request acts for a user chosen by
// `Authorization: Basic base64("name:")` (RPCs) or `?username=` (/files),
// else the default user of the Settings. The daemon authenticates callers,
// so nothing here checks access tokens.
package envd

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cellfork/cellfork/internal/agent"
	wire "github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/envd/filesystem/filesystemconnect"
	"github.com/cellfork/cellfork/internal/envd/process/processconnect"
)

// defaultMaxUpload is the per-request upload limit without
// CELLFORK_MAX_UPLOAD_BYTES.
const defaultMaxUpload int64 = 1 << 30

// maxInitBody bounds the POST /init body.
const maxInitBody = 1 << 20

// Handler serves the envd port (49983).
type Handler struct {
	http.Handler
	proc *processService
}

// Close ends the spare shells kept for fast process starts (running
// processes and watchers are left alone).
func (h *Handler) Close() { h.proc.zygotes.close() }

// Spare shell after /init: the default user's zygote is started once no
// request (on either port) has been in flight for zygoteQuiet, or
// zygoteMaxWait after the /init at the latest. Starting bash costs the
// sandbox 6-14 ms of CPU, which beside the first requests of a sandbox just
// taken from the pool (its hand-off, the client's first run_code) slowed
// them down.
const (
	zygoteQuiet   = 100 * time.Millisecond
	zygoteMaxWait = time.Second
)

// New returns the handler of the envd port. Its processes and watchers
// live as long as the returned handler. POST /init sets the sandbox's
// environment and process limits: only the daemon may, so when daemon is
// valid it is the only source address /init answers (code inside the
// sandbox connects from elsewhere; the daemon refuses /init from its
// clients). act counts the agent's requests (the handler counts its own
// in it; nil: a new one, for this port's requests only).
func New(s *agent.Settings, daemon netip.Addr, act *agent.Activity) *Handler {
	if act == nil {
		act = agent.NewActivity()
	}
	mux := http.NewServeMux()
	ps := newProcessService(s)
	mux.Handle(processconnect.NewProcessHandler(ps))
	mux.Handle(filesystemconnect.NewFilesystemHandler(newFSService(s)))

	files := &filesHandler{settings: s, maxUpload: maxUploadBytes()}
	mux.HandleFunc("GET /files", files.download)
	mux.HandleFunc("POST /files", files.upload)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /init", func(w http.ResponseWriter, r *http.Request) {
		if daemon.IsValid() {
			if ap, err := netip.ParseAddrPort(r.RemoteAddr); err != nil || ap.Addr().Unmap() != daemon {
				writeError(w, "init", newErr(kindPermission, "POST /init is the daemon's"))
				return
			}
		}
		if handleInit(s, act, w, r) {
			// The default user's spare shell, with the new settings, once
			// the sandbox's first requests are done.
			act.AfterQuiet(zygoteQuiet, zygoteMaxWait, ps.warmDefault)
		}
	})
	mux.HandleFunc("GET /envs", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Envs())
	})
	mux.Handle("GET /metrics", &metricsHandler{procRoot: "/proc"})
	return &Handler{Handler: act.Wrap(mux), proc: ps}
}

// maxUploadBytes reads CELLFORK_MAX_UPLOAD_BYTES (a positive byte count).
func maxUploadBytes() int64 {
	if n, err := strconv.ParseInt(os.Getenv("CELLFORK_MAX_UPLOAD_BYTES"), 10, 64); err == nil && n > 0 {
		return n
	}
	return defaultMaxUpload
}

// handleInit applies a POST /init and answers it; true if it was applied.
// The identity files are written after the answer, before act lets the
// sandbox's next request in.
func handleInit(s *agent.Settings, act *agent.Activity, w http.ResponseWriter, r *http.Request) bool {
	var req wire.InitRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxInitBody))
	if err == nil && bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
		err = errors.New("the body must be a JSON object, not null")
	}
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		writeError(w, "init", invalidf("decoding init body: %v", err))
		return false
	}
	for k, v := range req.EnvVars {
		if !agent.ValidEnvName(k) || containsNUL(v) {
			writeError(w, "init", invalidf("invalid environment variable %q", k))
			return false
		}
	}
	if req.DefaultWorkdir != "" && (req.DefaultWorkdir[0] != '/' || containsNUL(req.DefaultWorkdir)) {
		writeError(w, "init", invalidf("defaultWorkdir must be absolute, got %q", req.DefaultWorkdir))
		return false
	}
	if req.MaxUploadBytes < 0 || req.PidsMax < 0 || req.OpenFiles < 0 {
		writeError(w, "init", invalidf("maxUploadBytes, pidsMax and openFiles must not be negative"))
		return false
	}
	if req.PidsMax > 0 || req.OpenFiles > 0 {
		l := agent.ProcessLimits{PidsMax: uint64(req.PidsMax), OpenFiles: uint64(req.OpenFiles)}
		if err := agent.ApplyLimits("/proc", l); err != nil {
			writeError(w, "init", err)
			return false
		}
	}
	if req.CACert != "" {
		env, err := agent.TrustCA([]byte(req.CACert), trustPaths.bundle, trustPaths.caFile)
		if err != nil {
			writeError(w, "init", invalidf("%v", err))
			return false
		}
		// The caller's own variables (now or from an earlier /init) win.
		set := s.Envs()
		if req.EnvVars == nil {
			req.EnvVars = map[string]string{}
		}
		for k, v := range env {
			if _, ok := set[k]; !ok {
				if _, ok := req.EnvVars[k]; !ok {
					req.EnvVars[k] = v
				}
			}
		}
	}
	s.Init(req.DefaultUser, req.DefaultWorkdir, req.EnvVars)
	act.Later(func() { writeIdentity(identityDir, req.EnvVars) })
	if req.MaxUploadBytes > 0 {
		s.SetMaxUpload(req.MaxUploadBytes)
	}
	w.WriteHeader(http.StatusNoContent)
	return true
}

// trustPaths are where /init's caCert goes (tests change them).
var trustPaths = struct{ bundle, caFile string }{agent.SystemBundle, agent.EgressCAFile}

// identityDir is where E2B's sandboxes keep their identity variables as
// dot files, for shells that did not get them (a terminal, a cron job).
const identityDir = "/run/e2b"

// writeIdentity writes E2B's identity variables among envs to dir/.NAME
// (best effort: the variables themselves are what matters).
func writeIdentity(dir string, envs map[string]string) {
	for _, name := range []string{"E2B_SANDBOX", "E2B_SANDBOX_ID", "E2B_TEAM_ID", "E2B_TEMPLATE_ID"} {
		v, ok := envs[name]
		if !ok {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			log.Printf("writing %s: %v", dir, err)
			return
		}
		if err := os.WriteFile(filepath.Join(dir, "."+name), []byte(v), 0o644); err != nil {
			log.Printf("writing %s: %v", name, err)
		}
	}
}

func containsNUL(s string) bool {
	for i := range len(s) {
		if s[i] == 0 {
			return true
		}
	}
	return false
}
