package api

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
	"github.com/cellfork/cellfork/internal/templates"
	"github.com/cellfork/cellfork/internal/templates/build"
)

// Templates is the custom template store the API serves as E2B's template
// API (internal/templates.Service).
type Templates interface {
	// Every call but Usage sees the templates of the team its context is
	// scoped to (sandbox.WithTeam), or all of them on a single host.
	Create(context.Context, templates.CreateRequest) (*templates.Template, *templates.Build, error)
	FilePresent(ctx context.Context, idOrName, hash string) (bool, error)
	PutFile(ctx context.Context, idOrName, hash string, r io.Reader) error
	StartBuild(ctx context.Context, idOrName, buildID string, spec build.Spec) error
	BuildStatus(ctx context.Context, idOrName, buildID string, offset, limit int, level string) (*templates.BuildInfo, error)
	BuildLogs(ctx context.Context, idOrName, buildID string, cursor time.Time, limit int, forward bool, level string) ([]templates.LogEntry, error)
	List(context.Context) []*templates.Template
	Get(ctx context.Context, idOrName string) (*templates.Template, error)
	Update(ctx context.Context, idOrName string, public *bool) (*templates.Template, error)
	Delete(ctx context.Context, idOrName string) error
	AssignTags(ctx context.Context, target string, tags []string) (string, error)
	RemoveTags(ctx context.Context, name string, tags []string) error
	Usage() (templates.Usage, error)
}

// templateRoutes registers E2B's template API. Without a template store
// every one of them answers 404 (the SDKs then say the template API is
// missing).
func (s *Server) templateRoutes() {
	s.mux.HandleFunc("POST /v3/templates", s.createTemplate)
	s.mux.HandleFunc("POST /v2/templates", s.createTemplateV2)
	s.mux.HandleFunc("GET /v2/templates", s.listTemplates)
	s.mux.HandleFunc("GET /templates", s.listTemplates)
	s.mux.HandleFunc("GET /templates/usage", s.templateUsage)
	s.mux.HandleFunc("GET /templates/aliases/{alias}", s.templateAlias)
	s.mux.HandleFunc("GET /templates/{templateID}", s.getTemplate)
	s.mux.HandleFunc("PATCH /templates/{templateID}", s.updateTemplate)
	s.mux.HandleFunc("PATCH /v2/templates/{templateID}", s.updateTemplate)
	s.mux.HandleFunc("GET /templates/{templateID}/files/{hash}", s.templateFileLink)
	s.mux.HandleFunc("PUT /templates/{templateID}/files/{hash}", s.uploadTemplateFile)
	s.mux.HandleFunc("POST /v2/templates/{templateID}/builds/{buildID}", s.startTemplateBuild)
	s.mux.HandleFunc("GET /templates/{templateID}/builds/{buildID}/status", s.templateBuildStatus)
	s.mux.HandleFunc("GET /templates/{templateID}/builds/{buildID}/logs", s.templateBuildLogs)
	s.mux.HandleFunc("POST /templates/tags", s.assignTemplateTags)
	s.mux.HandleFunc("DELETE /templates/tags", s.deleteTemplateTags)
	// GET /templates/{templateID}/tags and GET /templates/aliases/{alias}
	// would both match /templates/aliases/tags, which ServeMux refuses:
	// the tags route is reached through this one (aliases, being more
	// specific, wins for /templates/aliases/...).
	s.mux.HandleFunc("GET /templates/{templateID}/{sub}", s.templateSub)
}

// templateSub serves GET /templates/{templateID}/tags.
func (s *Server) templateSub(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("sub") != "tags" {
		writeError(w, requestID(w), http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
		return
	}
	s.templateTags(w, r)
}

// tpl returns the template store, or answers 404 when there is none.
func (s *Server) tpl(w http.ResponseWriter, r *http.Request) Templates {
	if s.cfg.Templates == nil {
		s.fail(w, r, errdefs.New(errdefs.ErrNotFound, "this daemon builds no custom templates"))
		return nil
	}
	return s.cfg.Templates
}

type createTemplateBody struct {
	Name     *string  `json:"name"`
	Alias    *string  `json:"alias"`
	Tags     []string `json:"tags"`
	CPUCount *int     `json:"cpuCount"`
	MemoryMB *int     `json:"memoryMB"`
	// Accepted (their types checked) and ignored: one team per daemon;
	// the disk is --disk-mb, in sandbox memory.
	TeamID        *string `json:"teamID"`
	MinFreeDiskMb *int    `json:"minFreeDiskMb"`
}

func (b *createTemplateBody) request() (templates.CreateRequest, error) {
	req := templates.CreateRequest{Tags: b.Tags}
	switch {
	case b.Name != nil && *b.Name != "":
		req.Name = *b.Name
	case b.Alias != nil && *b.Alias != "":
		req.Name = *b.Alias
	default:
		return req, errdefs.New(errdefs.ErrInvalidArgument, "name is required")
	}
	for _, f := range []struct {
		name string
		v    *int
		dst  *int
	}{{"cpuCount", b.CPUCount, &req.CPUCount}, {"memoryMB", b.MemoryMB, &req.MemoryMB}} {
		if f.v != nil {
			if *f.v <= 0 {
				return req, errdefs.New(errdefs.ErrInvalidArgument, "%s must be positive", f.name)
			}
			*f.dst = *f.v
		}
	}
	return req, nil
}

// createTemplate is E2B's POST /v3/templates: a build of template `name`
// (made if new), waiting for its steps.
func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	var b createTemplateBody
	if err := decodeRequired(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	req, err := b.request()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	t, bd, err := ts.Create(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": t.ID, "buildID": bd.ID, "public": t.Public, "names": t.Names, "aliases": t.Names, "tags": bd.Tags,
	})
}

// createTemplateV2 is E2B's deprecated POST /v2/templates (alias
// required), answered with a TemplateLegacy.
func (s *Server) createTemplateV2(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	var b createTemplateBody
	if err := decodeRequired(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	if b.Alias == nil || *b.Alias == "" {
		s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "alias is required"))
		return
	}
	b.Name = nil
	req, err := b.request()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	t, bd, err := ts.Create(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	body := templateJSON(t)
	body["buildID"] = bd.ID
	delete(body, "names")
	delete(body, "buildStatus")
	writeJSON(w, http.StatusAccepted, body)
}

// templateJSON is E2B's Template object.
func templateJSON(t *templates.Template) map[string]any {
	buildID, status := "", templates.StatusWaiting
	if n := len(t.Builds); n > 0 {
		buildID, status = t.Builds[n-1].ID, t.Builds[n-1].Status
	}
	for i := len(t.Builds) - 1; i >= 0; i-- {
		if b := t.Builds[i]; b.Status == templates.StatusReady && !b.Purged {
			buildID, status = b.ID, b.Status
			break
		}
	}
	var last any
	if t.LastSpawnedAt != nil {
		last = t.LastSpawnedAt.Format(time.RFC3339Nano)
	}
	return map[string]any{
		"templateID": t.ID, "buildID": buildID, "cpuCount": t.CPUCount, "memoryMB": t.MemoryMB,
		"diskSizeMB": t.DiskMB, "public": t.Public, "aliases": t.Names, "names": t.Names,
		"createdAt": t.CreatedAt.Format(time.RFC3339Nano), "updatedAt": t.UpdatedAt.Format(time.RFC3339Nano),
		"createdBy": nil, "lastSpawnedAt": last, "spawnCount": t.SpawnCount, "buildCount": len(t.Builds),
		"envdVersion": EnvdVersion, "buildStatus": status,
	}
}

// builtinJSON describes a built-in template as a Template.
func (s *Server) builtinJSON(name string) map[string]any {
	hash, _ := template.Hash(name)
	l := s.cfg.BuiltinLimits[name]
	epoch := time.Unix(0, 0).UTC().Format(time.RFC3339Nano)
	names := template.Aliases(name)
	return map[string]any{
		"templateID": name, "buildID": hash, "cpuCount": l.CPUCount, "memoryMB": l.MemoryMB,
		"diskSizeMB": l.DiskMB, "public": true, "aliases": names, "names": names,
		"createdAt": epoch, "updatedAt": epoch, "createdBy": nil, "lastSpawnedAt": nil,
		"spawnCount": 0, "buildCount": 1, "envdVersion": EnvdVersion, "buildStatus": templates.StatusReady,
	}
}

// listTemplates lists the built-in templates, then the custom ones.
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	if err := checkListQuery(r); err != nil {
		s.fail(w, r, err)
		return
	}
	out := []map[string]any{}
	for _, name := range template.Names() {
		out = append(out, s.builtinJSON(name))
	}
	if s.cfg.Templates != nil {
		for _, t := range s.cfg.Templates.List(r.Context()) {
			out = append(out, templateJSON(t))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// checkListQuery refuses typed query parameters given empty or invalid.
func checkListQuery(r *http.Request) error {
	q := r.URL.Query()
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > 100 {
			return errdefs.New(errdefs.ErrInvalidArgument, "limit must be an integer between 1 and 100")
		}
	}
	return nil
}

// getTemplate is E2B's GET /templates/{id}: the template with its builds.
func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("templateID")
	if name, err := template.Resolve(id); err == nil {
		b := s.builtinJSON(name)
		writeJSON(w, http.StatusOK, map[string]any{
			"templateID": name, "public": true, "aliases": b["aliases"], "names": b["names"],
			"createdAt": b["createdAt"], "updatedAt": b["updatedAt"], "lastSpawnedAt": nil, "spawnCount": 0,
			"builds": []map[string]any{{"buildID": b["buildID"], "status": templates.StatusReady, "createdAt": b["createdAt"],
				"updatedAt": b["updatedAt"], "cpuCount": b["cpuCount"], "memoryMB": b["memoryMB"], "diskSizeMB": b["diskSizeMB"],
				"envdVersion": EnvdVersion}},
		})
		return
	}
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	t, err := ts.Get(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	tb := templateJSON(t)
	builds := []map[string]any{}
	for i := len(t.Builds) - 1; i >= 0; i-- {
		b := t.Builds[i]
		e := map[string]any{"buildID": b.ID, "status": b.Status, "createdAt": b.CreatedAt.Format(time.RFC3339Nano),
			"updatedAt": b.UpdatedAt.Format(time.RFC3339Nano), "cpuCount": b.CPUCount, "memoryMB": b.MemoryMB,
			"diskSizeMB": b.DiskMB, "envdVersion": EnvdVersion}
		if b.FinishedAt != nil {
			e["finishedAt"] = b.FinishedAt.Format(time.RFC3339Nano)
		}
		builds = append(builds, e)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"templateID": t.ID, "public": t.Public, "aliases": t.Names, "names": t.Names, "createdAt": tb["createdAt"],
		"updatedAt": tb["updatedAt"], "lastSpawnedAt": tb["lastSpawnedAt"], "spawnCount": t.SpawnCount, "builds": builds,
	})
}

func (s *Server) updateTemplate(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	var b struct {
		Public *bool `json:"public"`
	}
	if err := decodeRequired(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	t, err := ts.Update(r.Context(), r.PathValue("templateID"), b.Public)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"names": t.Names})
}

// deleteTemplate is E2B's DELETE /templates/{id}: a custom template, or
// else a snapshot (Sandbox.delete_snapshot() deletes snapshots there).
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("templateID")
	if s.cfg.Templates != nil {
		err := s.cfg.Templates.Delete(r.Context(), id)
		if err == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			s.fail(w, r, err)
			return
		}
	}
	err := errdefs.ErrNotFound
	if s.m != nil {
		err = s.m.DeleteSnapshot(r.Context(), id)
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = errdefs.New(errdefs.ErrNotFound, "template or snapshot %q not found", id)
		}
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateAlias is E2B's GET /templates/aliases/{alias}
// (Template.exists): built-in names and custom templates' names.
func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request) {
	alias := r.PathValue("alias")
	if name, err := template.Resolve(alias); err == nil {
		writeJSON(w, http.StatusOK, map[string]any{"templateID": name, "public": true})
		return
	}
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	t, err := ts.Get(r.Context(), alias)
	if err == nil && !slices.Contains(t.Names, alias) { // an id is not an alias
		err = errdefs.New(errdefs.ErrNotFound, "no template is named %q", alias)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": t.ID, "public": t.Public})
}

func (s *Server) templateUsage(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	u, err := ts.Usage()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"layersBytes": u.LayersBytes, "buildsBytes": u.BuildsBytes,
		"uploadsBytes": u.UploadsBytes, "totalBytes": u.TotalBytes, "capBytes": u.CapBytes, "layers": u.Layers})
}

// uploadURLTTL is how long an upload link works.
const uploadURLTTL = time.Hour

// uploadSignature signs an upload link: the template, the files hash and
// the expiry, under a key that lives as long as the daemon.
func (s *Server) uploadSignature(templateID, hash string, expires int64) string {
	m := hmac.New(sha256.New, s.uploadKey)
	fmt.Fprintf(m, "PUT\x00%s\x00%s\x00%d", templateID, hash, expires)
	return hex.EncodeToString(m.Sum(nil))
}

func newUploadKey() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return k
}

// signedUpload reports whether r is a PUT to an upload link this daemon
// signed and that has not expired: it needs no API key (the SDKs send the
// file without one, as to a presigned S3 URL).
func (s *Server) signedUpload(r *http.Request) bool {
	if r.Method != http.MethodPut || !strings.HasPrefix(r.URL.Path, "/templates/") {
		return false
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/templates/"), "/")
	if len(parts) != 3 || parts[1] != "files" {
		return false
	}
	id, err := url.PathUnescape(parts[0])
	if err != nil {
		return false
	}
	q := r.URL.Query()
	exp, err := strconv.ParseInt(q.Get("expires"), 10, 64)
	if err != nil || time.Now().Unix() > exp {
		return false
	}
	want := s.uploadSignature(id, parts[2], exp)
	return hmac.Equal([]byte(want), []byte(q.Get("signature")))
}

// templateFileLink is E2B's GET /templates/{id}/files/{hash}: whether the
// files are cached, and where to PUT them if not (a link signed for an
// hour, on the host the caller used).
func (s *Server) templateFileLink(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	id, hash := r.PathValue("templateID"), r.PathValue("hash")
	present, err := ts.FilePresent(r.Context(), id, hash)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	exp := time.Now().Add(uploadURLTTL).Unix()
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	u := fmt.Sprintf("%s://%s/templates/%s/files/%s?expires=%d&signature=%s", scheme, r.Host,
		url.PathEscape(id), hash, exp, s.uploadSignature(id, hash, exp))
	writeJSON(w, http.StatusCreated, map[string]any{"present": present, "url": u})
}

// uploadTemplateFile receives files for COPY steps (or an image archive)
// through a signed link.
func (s *Server) uploadTemplateFile(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	// A signed link names the template it was issued for (to its team):
	// it is found whoever sends it (a gateway passes such a PUT on for no
	// team).
	ctx := context.Background()
	if !s.signedUpload(r) {
		var msg string
		ctx, msg = s.cfg.Auth.Control(r)
		if team, ok := sandbox.TeamOf(ctx); ok && team == "" && msg == "" {
			msg = "no team" // a gateway passing on a link it could not check
		}
		if msg != "" {
			writeError(w, requestID(w), http.StatusUnauthorized, "upload link missing, expired or not signed by this daemon: ask GET /templates/{templateID}/files/{hash} for a new one")
			return
		}
	}
	if err := ts.PutFile(ctx, r.PathValue("templateID"), r.PathValue("hash"), r.Body); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// startBuildBody is E2B's TemplateBuildStartV2 (plus fromImageFile).
type startBuildBody struct {
	build.Spec
}

func (s *Server) startTemplateBuild(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	var b startBuildBody
	if err := decodeRequired(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := ts.StartBuild(r.Context(), r.PathValue("templateID"), r.PathValue("buildID"), b.Spec); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// intParam reads an optional integer query parameter within [lo, hi].
func intParam(r *http.Request, name string, def, lo, hi int) (int, error) {
	q := r.URL.Query()
	if !q.Has(name) {
		return def, nil
	}
	n, err := strconv.Atoi(q.Get(name))
	if err != nil || n < lo || n > hi {
		return 0, errdefs.New(errdefs.ErrInvalidArgument, "%s must be an integer between %d and %d", name, lo, hi)
	}
	return n, nil
}

func levelParam(r *http.Request) (string, error) {
	q := r.URL.Query()
	if !q.Has("level") {
		return "", nil
	}
	switch l := q.Get("level"); l {
	case "debug", "info", "warn", "error":
		return l, nil
	}
	return "", errdefs.New(errdefs.ErrInvalidArgument, "level must be debug, info, warn or error")
}

func logEntryJSON(e templates.LogEntry) map[string]any {
	m := map[string]any{"timestamp": e.Timestamp.Format(time.RFC3339Nano), "level": e.Level, "message": e.Message}
	if e.Step != "" {
		m["step"] = e.Step
	}
	return m
}

// templateBuildStatus is E2B's build status with a page of log entries
// (the SDKs poll it, advancing logsOffset).
func (s *Server) templateBuildStatus(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	offset, err := intParam(r, "logsOffset", 0, 0, 1<<31-1)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	limit, err := intParam(r, "limit", 100, 0, 100)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	level, err := levelParam(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	info, err := ts.BuildStatus(r.Context(), r.PathValue("templateID"), r.PathValue("buildID"), offset, limit, level)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	entries := []map[string]any{}
	for _, e := range info.Logs {
		entries = append(entries, logEntryJSON(e))
	}
	body := map[string]any{"templateID": info.TemplateID, "buildID": info.Build.ID, "status": info.Build.Status,
		"logs": []string{}, "logEntries": entries}
	if rs := info.Build.Reason; rs != nil {
		reason := map[string]any{"message": rs.Message}
		if rs.Step != "" {
			reason["step"] = rs.Step
		}
		var re []map[string]any
		for _, e := range rs.Logs {
			re = append(re, logEntryJSON(e))
		}
		if len(re) > 0 {
			reason["logEntries"] = re
		}
		body["reason"] = reason
	}
	writeJSON(w, http.StatusOK, body)
}

// templateBuildLogs is E2B's build logs by time cursor.
func (s *Server) templateBuildLogs(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	q := r.URL.Query()
	var cursor time.Time
	if q.Has("cursor") {
		ms, err := strconv.ParseInt(q.Get("cursor"), 10, 64)
		if err != nil || ms < 0 {
			s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "cursor must be a non-negative number of milliseconds"))
			return
		}
		cursor = time.UnixMilli(ms)
	}
	limit, err := intParam(r, "limit", 100, 0, 100)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	forward := true
	if q.Has("direction") {
		switch q.Get("direction") {
		case "forward":
		case "backward":
			forward = false
		default:
			s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "direction must be forward or backward"))
			return
		}
	}
	if q.Has("source") && q.Get("source") != "temporary" && q.Get("source") != "persistent" {
		s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "source must be temporary or persistent"))
		return
	}
	level, err := levelParam(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	logs, err := ts.BuildLogs(r.Context(), r.PathValue("templateID"), r.PathValue("buildID"), cursor, limit, forward, level)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []map[string]any{}
	for _, e := range logs {
		out = append(out, logEntryJSON(e))
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": out})
}

func (s *Server) assignTemplateTags(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	var b struct {
		Target *string  `json:"target"`
		Tags   []string `json:"tags"`
	}
	if err := decodeRequired(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	if b.Target == nil || b.Tags == nil {
		s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "target and tags are required"))
		return
	}
	id, err := ts.AssignTags(r.Context(), *b.Target, b.Tags)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"tags": b.Tags, "buildID": id})
}

func (s *Server) deleteTemplateTags(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	var b struct {
		Name *string  `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := decodeRequired(w, r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	if b.Name == nil || b.Tags == nil {
		s.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "name and tags are required"))
		return
	}
	if err := ts.RemoveTags(r.Context(), *b.Name, b.Tags); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) templateTags(w http.ResponseWriter, r *http.Request) {
	ts := s.tpl(w, r)
	if ts == nil {
		return
	}
	t, err := ts.Get(r.Context(), r.PathValue("templateID"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []map[string]any{}
	tags := make([]string, 0, len(t.Tags))
	for tag := range t.Tags {
		tags = append(tags, tag)
	}
	slices.Sort(tags)
	for _, tag := range tags {
		ref := t.Tags[tag]
		out = append(out, map[string]any{"tag": tag, "buildID": ref.BuildID, "createdAt": ref.CreatedAt.Format(time.RFC3339Nano)})
	}
	writeJSON(w, http.StatusOK, out)
}
