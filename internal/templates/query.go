package templates

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/templates/build"
)

// List returns the templates ctx's team sees, oldest first.
func (s *Service) List(ctx context.Context) []*Template {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Template, 0, len(s.st.Templates))
	for _, t := range s.st.Templates {
		if sandbox.Sees(ctx, t.Team) {
			out = append(out, cloneTemplate(t))
		}
	}
	return out
}

// Get returns the template an id or name names.
func (s *Service) Get(ctx context.Context, idOrName string) (*Template, error) {
	name, _ := SplitName(idOrName)
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.findLocked(ctx, name)
	if t == nil {
		return nil, notFound(idOrName)
	}
	return cloneTemplate(t), nil
}

// Alias returns the template a name (or id) names: E2B's alias check.
func (s *Service) Alias(ctx context.Context, name string) (*Template, error) { return s.Get(ctx, name) }

// BuildInfo is a build's status with a page of its log.
type BuildInfo struct {
	TemplateID string
	Build      *Build
	Logs       []LogEntry
}

// levels orders log levels for filtering.
var levels = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

// BuildStatus returns a build's status and up to limit log entries from
// offset (entries below level left out before paging).
func (s *Service) BuildStatus(ctx context.Context, idOrName, buildID string, offset, limit int, level string) (*BuildInfo, error) {
	s.mu.Lock()
	t := s.findLocked(ctx, idOrName)
	if t == nil {
		s.mu.Unlock()
		return nil, notFound(idOrName)
	}
	b := t.build(buildID)
	if b == nil {
		s.mu.Unlock()
		return nil, errdefs.New(errdefs.ErrNotFound, "build %q of template %q not found", buildID, idOrName)
	}
	info := &BuildInfo{TemplateID: t.ID, Build: cloneBuild(b)}
	lg := s.logs[buildID]
	s.mu.Unlock()
	var entries []LogEntry
	if lg != nil {
		entries = lg.snapshot()
	} else {
		entries = readBuildLog(s.buildDir(buildID))
	}
	if min, ok := levels[level]; ok {
		entries = slices.DeleteFunc(entries, func(e LogEntry) bool { return levels[e.Level] < min })
	}
	if offset > len(entries) {
		offset = len(entries)
	}
	entries = entries[offset:]
	if limit >= 0 && len(entries) > limit {
		entries = entries[:limit]
	}
	info.Logs = entries
	return info, nil
}

// BuildLogs returns up to limit entries at or after cursor (forward) or
// before it (backward), as E2B's logs endpoint.
func (s *Service) BuildLogs(ctx context.Context, idOrName, buildID string, cursor time.Time, limit int, forward bool, level string) ([]LogEntry, error) {
	info, err := s.BuildStatus(ctx, idOrName, buildID, 0, -1, level)
	if err != nil {
		return nil, err
	}
	var out []LogEntry
	if forward {
		for _, e := range info.Logs {
			if !e.Timestamp.Before(cursor) && len(out) < limit {
				out = append(out, e)
			}
		}
		return out, nil
	}
	for i := len(info.Logs) - 1; i >= 0 && len(out) < limit; i-- {
		if e := info.Logs[i]; cursor.IsZero() || e.Timestamp.Before(cursor) {
			out = append(out, e)
		}
	}
	slices.Reverse(out)
	return out, nil
}

// Update sets whether a template is public (E2B's PATCH); it returns the
// template.
func (s *Service) Update(ctx context.Context, idOrName string, public *bool) (*Template, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.findLocked(ctx, idOrName)
	if t == nil {
		return nil, notFound(idOrName)
	}
	if public != nil {
		t.Public = *public
		t.UpdatedAt = time.Now().UTC()
		if err := s.saveLocked(); err != nil {
			return nil, err
		}
	}
	return cloneTemplate(t), nil
}

// AssignTags points tags at the build target ("name:tag", or "name" for
// the newest ready build) names. It returns the build id.
func (s *Service) AssignTags(ctx context.Context, target string, tags []string) (string, error) {
	id, t, err := s.assignTags(ctx, target, tags)
	if err == nil {
		s.syncShared(t.Team, t.ID)
	}
	return id, err
}

func (s *Service) assignTags(ctx context.Context, target string, tags []string) (string, *Template, error) {
	name, tag := SplitName(target)
	if name == "" {
		return "", nil, errdefs.New(errdefs.ErrInvalidArgument, "target %q must be name:tag", target)
	}
	if len(tags) == 0 {
		return "", nil, errdefs.New(errdefs.ErrInvalidArgument, "no tags to assign")
	}
	for _, tg := range tags {
		if err := validTag(tg); err != nil {
			return "", nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.findLocked(ctx, name)
	if t == nil {
		return "", nil, notFound(name)
	}
	var b *Build
	if tag == "" {
		b = t.latestReady()
	} else if ref, ok := t.Tags[tag]; ok {
		b = t.build(ref.BuildID)
	}
	if b == nil || b.Status != StatusReady {
		return "", nil, errdefs.New(errdefs.ErrNotFound, "template %q has no ready build tagged %q", name, tag)
	}
	now := time.Now().UTC()
	for _, tg := range tags {
		t.Tags[tg] = TagRef{BuildID: b.ID, CreatedAt: now}
	}
	t.UpdatedAt = now
	return b.ID, t, s.saveLocked()
}

// RemoveTags removes tags from template name.
func (s *Service) RemoveTags(ctx context.Context, name string, tags []string) error {
	t, err := s.removeTags(ctx, name, tags)
	if err == nil {
		s.syncShared(t.Team, t.ID)
	}
	return err
}

func (s *Service) removeTags(ctx context.Context, name string, tags []string) (*Template, error) {
	if len(tags) == 0 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "no tags to remove")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.findLocked(ctx, name)
	if t == nil {
		return nil, notFound(name)
	}
	for _, tg := range tags {
		if _, ok := t.Tags[tg]; !ok {
			return nil, errdefs.New(errdefs.ErrNotFound, "template %q has no tag %q", name, tg)
		}
	}
	for _, tg := range tags {
		delete(t.Tags, tg)
	}
	t.UpdatedAt = time.Now().UTC()
	return t, s.saveLocked()
}

// Delete removes a template: its pool sandboxes at once, its builds'
// files once no sandbox or snapshot uses them, its layers when the
// collector finds nothing else using them. Running builds are stopped.
func (s *Service) Delete(ctx context.Context, idOrName string) error {
	s.mu.Lock()
	t := s.findLocked(ctx, idOrName)
	if t == nil {
		s.mu.Unlock()
		return notFound(idOrName)
	}
	s.st.Templates = slices.DeleteFunc(s.st.Templates, func(o *Template) bool { return o == t })
	for _, b := range t.Builds {
		s.cancelLocked(b.ID)
		s.cfg.Pool.UnwarmCustom(b.ID)
		s.removeLater(s.buildDir(b.ID))
	}
	err := s.saveLocked()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.syncShared(t.Team, t.ID)
	s.collect(context.Background())
	return nil
}

// ResolveTemplate returns the build a sandbox create names: "name",
// "name:tag" or a template id (with or without a tag). Without a tag it is
// the newest ready build. ErrNotFound when nothing matches;
// ErrFailedPrecondition when the template has no ready build.
func (s *Service) ResolveTemplate(ctx context.Context, id string) (Resolved, error) {
	r, err := s.resolveLocal(ctx, id)
	if s.cfg.Shared != nil && errors.Is(err, errdefs.ErrNotFound) {
		if rs, serr := s.resolveShared(ctx, id); !errors.Is(serr, errdefs.ErrNotFound) {
			return rs, serr
		}
	}
	return r, err
}

// resolveLocal resolves id among the templates this host built.
func (s *Service) resolveLocal(ctx context.Context, id string) (Resolved, error) {
	name, tag := SplitName(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.findLocked(ctx, name)
	if t == nil {
		return Resolved{}, notFound(id)
	}
	var b *Build
	if tag == "" {
		b = t.latestReady()
	} else if ref, ok := t.Tags[tag]; ok {
		b = t.build(ref.BuildID)
	} else {
		return Resolved{}, errdefs.New(errdefs.ErrNotFound, "template %q has no tag %q", name, tag)
	}
	if b == nil || b.Status != StatusReady || b.Purged {
		return Resolved{}, errdefs.New(errdefs.ErrFailedPrecondition, "template %q has no ready build yet", id)
	}
	if _, err := os.Stat(filepath.Join(b.Image, "checkpoint.img")); err != nil {
		return Resolved{}, errdefs.New(errdefs.ErrUnavailable, "template %q is being rebuilt for this daemon; try again shortly", id)
	}
	now := time.Now().UTC()
	t.LastSpawnedAt = &now
	t.SpawnCount++
	return s.resolvedLocked(t, b), nil
}

// Parent returns the layers and context of the build a fromTemplate names
// (build.Config.Parent).
func (s *Service) Parent(ctx context.Context, id string) (build.Parent, error) {
	name, tag := SplitName(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.findLocked(ctx, name)
	if t == nil {
		return build.Parent{}, errdefs.New(errdefs.ErrNotFound, "base template %q not found", id)
	}
	var b *Build
	if tag == "" {
		b = t.latestReady()
	} else if ref, ok := t.Tags[tag]; ok {
		b = t.build(ref.BuildID)
	}
	if b == nil || b.Status != StatusReady || b.Purged {
		return build.Parent{}, errdefs.New(errdefs.ErrFailedPrecondition, "base template %q has no ready build", id)
	}
	return build.Parent{Layers: slices.Clone(b.Layers), Context: b.Context}, nil
}

// keptBuildsLocked lists the builds whose files the records still need (for
// tests and the collector).
func (s *Service) keptBuildsLocked() map[string]*Build {
	kept := map[string]*Build{}
	for _, t := range s.st.Templates {
		if b := t.latestReady(); b != nil {
			kept[b.ID] = b
		}
		for _, ref := range t.Tags {
			if b := t.build(ref.BuildID); b != nil && b.Status == StatusReady && !b.Purged {
				kept[b.ID] = b
			}
		}
	}
	return kept
}
