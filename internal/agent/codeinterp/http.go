package codeinterp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/cellfork/cellfork/internal/agent"
)

const maxRequestBytes = 64 << 20

// Handler serves the E2B code-interpreter API:
//
//	POST   /execute               run code, streaming NDJSON events
//	GET    /contexts              list contexts (the default one included)
//	POST   /contexts              create a context {"language"?, "cwd"?}
//	POST   /contexts/{id}/restart fresh interpreter, same id
//	DELETE /contexts/{id}         kill and forget a context
//	GET    /health                200 "OK", as E2B's
func (i *Interpreter) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /execute", i.handleExecute)
	mux.HandleFunc("GET /contexts", i.handleList)
	mux.HandleFunc("POST /contexts", i.handleCreate)
	mux.HandleFunc("POST /contexts/{id}/restart", i.handleRestart)
	mux.HandleFunc("DELETE /contexts/{id}", i.handleDelete)
	// E2B's code interpreter answers 200 with the JSON string "OK" (its
	// template's readiness check wants a 200).
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, "OK")
	})
	return mux
}

// executeRequest is the SDK's /execute body; JSON nulls read as "", except
// for code, which is required (as upstream's).
type executeRequest struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

func (i *Interpreter) handleExecute(w http.ResponseWriter, r *http.Request) {
	var req executeRequest
	if err := readJSON(r, &req); err != nil {
		i.writeError(w, err)
		return
	}
	if req.Code == nil {
		i.writeError(w, fmt.Errorf("code is required: %w", errInvalid))
		return
	}
	for k, v := range req.EnvVars {
		// Python's os.environ refuses these; the kernel would die of it.
		if !agent.ValidEnvName(k) || strings.IndexByte(v, 0) >= 0 {
			i.writeError(w, fmt.Errorf("env_vars: invalid environment variable %q: %w", k, errInvalid))
			return
		}
	}
	req.EnvVars = agent.WithTraceEnv(r.Header, req.EnvVars)
	c, err := i.resolve(req.ContextID, req.Language)
	if err != nil {
		i.writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	out := newNDJSON(w, i.log)
	// The headers go now, not with the first output: a client whose
	// sandbox dies during silent code then sees a broken stream, which the
	// SDKs report as the sandbox being killed.
	out.flush()
	i.execute(r.Context(), c, req, out)
}

// resolve picks the context of an execution.
func (i *Interpreter) resolve(id, language string) (*codeContext, error) {
	if id != "" && language != "" {
		return nil, fmt.Errorf("context_id and language are mutually exclusive: %w", errInvalid)
	}
	if id != "" {
		return i.lookup(id)
	}
	lang, err := normalizeLanguage(language)
	if err != nil {
		return nil, err
	}
	if err := i.available(lang); err != nil {
		return nil, err
	}
	return i.defaultContext(lang)
}

// execute runs one request in c. The stream always ends with
// end_of_execution.
func (i *Interpreter) execute(ctx context.Context, c *codeContext, req executeRequest, out *ndjson) {
	defer out.write(endLine)
	if !c.acquire(ctx, out, i.timing.keepalive) {
		return // the client left before its turn: nothing ran
	}
	defer c.release()
	// A kernel killed while idle (say, by a pkill of the user's processes)
	// may be seen dead only once it has the command: run then says it took
	// nothing, and the command goes to a fresh kernel, once.
	for attempt := 0; ; attempt++ {
		k, err := c.kernel(ctx, i.spawnSpec)
		if err != nil {
			name := "KernelError"
			if errors.Is(err, errRemoved) {
				name = "ContextNotFound"
			}
			i.log.Warn("no kernel for execution", "context.id", c.id, "err", err)
			out.write(errorLine(name, err.Error(), ""))
			return
		}
		cmd, err := k.command(*req.Code, i.settings.Envs(), req.EnvVars)
		if err != nil {
			out.write(errorLine("KernelError", err.Error(), ""))
			return
		}
		if k.run(ctx, cmd, out, i.timing) {
			return
		}
		i.log.Warn("kernel died before it took the command", "context.id", c.id, "state", k.exitState(), "attempt", attempt+1)
		if attempt == 1 {
			out.write(errorLine("UnexpectedEndOfExecution",
				"the kernel exited ("+k.exitState()+") before it ran the code, twice; the next execution starts a fresh one",
				k.diagnostics()))
			return
		}
	}
}

// createRequest is the POST /contexts body (may be empty).
type createRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (i *Interpreter) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := readJSON(r, &req); err != nil {
		i.writeError(w, err)
		return
	}
	lang, err := normalizeLanguage(req.Language)
	if err == nil {
		err = i.available(lang)
	}
	if err != nil {
		i.writeError(w, err)
		return
	}
	c, err := i.create(r.Context(), lang, req.Cwd)
	if err != nil {
		i.writeError(w, err)
		return
	}
	writeJSON(w, c.info())
}

func (i *Interpreter) handleList(w http.ResponseWriter, r *http.Request) {
	infos, err := i.list()
	if err != nil {
		i.writeError(w, err)
		return
	}
	writeJSON(w, infos)
}

func (i *Interpreter) handleRestart(w http.ResponseWriter, r *http.Request) {
	c, err := i.lookup(r.PathValue("id"))
	if err == nil {
		err = c.restart(r.Context(), i.spawnSpec)
	}
	if err != nil {
		i.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (i *Interpreter) handleDelete(w http.ResponseWriter, r *http.Request) {
	if err := i.remove(r.PathValue("id")); err != nil {
		i.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// readJSON decodes the request body into v; an empty body leaves v as is,
// a null one is refused.
// The body is read to the end, so the server notices when the client
// goes away.
func readJSON(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBytes+1))
	if err != nil {
		return fmt.Errorf("reading request: %w", err)
	}
	if len(body) > maxRequestBytes {
		return fmt.Errorf("request body larger than %d bytes: %w", maxRequestBytes, errInvalid)
	}
	switch string(bytes.TrimSpace(body)) {
	case "":
		return nil
	case "null": // would decode to nothing, as if the body were {}
		return fmt.Errorf("the body must be a JSON object, not null: %w", errInvalid)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decoding request: %s: %w", err, errInvalid)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// writeError is the one place that maps error classes to HTTP status.
// Bodies are plain text, as upstream's.
func (i *Interpreter) writeError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, errInvalid), errors.Is(err, errUnavailable):
		status = http.StatusBadRequest
	case errors.Is(err, errNotFound):
		status = http.StatusNotFound
	case errors.Is(err, errClosed):
		status = http.StatusServiceUnavailable
	default:
		i.log.Error("code interpreter request failed", "err", err)
	}
	http.Error(w, err.Error(), status)
}
