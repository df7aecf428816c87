package templates

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/templates/build"
	"github.com/cellfork/cellfork/internal/templates/layers"
)

// What the collector keeps and removes:
//
//   - A template's newest ready build, and builds a tag names, keep their
//     root and warm image. Other builds' directories are removed once no
//     sandbox or snapshot runs on their root (a snapshot restores against
//     the very root it was taken on); a failed build keeps only its log.
//   - Layers that a kept build is made of stay. Others (of failed,
//     superseded or deleted builds) stay as cache for LayerTTL after their
//     last use, or until the disk cap needs their room, oldest first.
//   - Uploaded files stay for LayerTTL after their last use.
//   - A build pulled from the cluster (shared.go) stays while a sandbox or
//     snapshot runs on its root, and for LayerTTL after its last create;
//     the next create pulls it again.
//
// Roots are hard links to layer files, so removing a layer frees only what
// no root still links.

// removeLater queues a build directory for removal. Caller holds mu.
func (s *Service) removeLater(dir string) {
	if !slices.Contains(s.st.Removing, dir) {
		s.st.Removing = append(s.st.Removing, dir)
	}
}

// collectLoop collects every few minutes (sandboxes that ran on an old
// root end at any time) and saves the spawn counters.
func (s *Service) collectLoop() {
	t := time.NewTicker(5 * time.Minute)
	defer t.Stop()
	for {
		select {
		case <-s.stopped.Done():
			s.mu.Lock()
			_ = s.saveLocked()
			s.mu.Unlock()
			return
		case <-t.C:
			s.collect(s.stopped)
		}
	}
}

// collect removes what nothing needs (see above). maxAge: layers and
// uploads unused for longer go; need: bytes to free beyond that (for the
// disk cap), taken from the least recently used unreferenced layers.
func (s *Service) collect(ctx context.Context) {
	s.collectLayers(ctx, s.cfg.LayerTTL, 0)
	s.collectPulled(ctx, s.cfg.LayerTTL)
}

// collectPulled removes the pulled builds unused for maxAge (the mtime of
// their artifact.json is their last create) that nothing runs on.
func (s *Service) collectPulled(ctx context.Context, maxAge time.Duration) {
	ents, _ := os.ReadDir(filepath.Join(s.cfg.Dir, "pulled"))
	if len(ents) == 0 {
		return
	}
	inUse, err := s.cfg.Pool.RootfsInUse(ctx)
	if err != nil {
		return
	}
	cutoff := time.Now().Add(-maxAge)
	for _, e := range ents {
		dir := s.pulledDir(e.Name())
		fi, err := os.Stat(filepath.Join(dir, "artifact.json"))
		switch {
		case err != nil && strings.Contains(e.Name(), ".tmp-"):
			if info, ierr := e.Info(); ierr == nil && info.ModTime().Before(cutoff) {
				_ = os.RemoveAll(dir) // a pull a crash cut short
			}
			continue
		case err != nil || fi.ModTime().After(cutoff) || inUse[filepath.Join(dir, "rootfs")]:
			continue
		}
		aside := dir + ".gone-" + newTemplateID()[:6]
		s.pulledMu.Lock()
		fi, err = os.Stat(filepath.Join(dir, "artifact.json"))
		gone := err == nil && fi.ModTime().Before(cutoff) && os.Rename(dir, aside) == nil
		s.pulledMu.Unlock()
		if gone {
			s.cfg.Pool.UnwarmCustom(e.Name())
			_ = os.RemoveAll(aside)
			s.log.Info("pulled template removed (unused)", "build.id", e.Name())
		}
	}
}

func (s *Service) collectLayers(ctx context.Context, maxAge time.Duration, need int64) int64 {
	inUse, err := s.cfg.Pool.RootfsInUse(ctx)
	if err != nil {
		s.log.Warn("template collection skipped", "err", err)
		return 0
	}
	s.mu.Lock()
	kept := s.keptBuildsLocked()
	for _, t := range s.st.Templates {
		for _, b := range t.Builds {
			if b.Status == StatusReady && !b.Purged && kept[b.ID] == nil && !inUse[b.Rootfs] {
				b.Purged = true
				s.cfg.Pool.UnwarmCustom(b.ID)
				s.removeLater(s.buildDir(b.ID))
			}
		}
	}
	// What goes is removed after the lock is released (a root is tens of
	// thousands of links): renamed aside first, so a crash never leaves
	// half a root under a build's name.
	var still, gone []string
	for _, dir := range s.st.Removing {
		if inUse[filepath.Join(dir, "rootfs")] {
			still = append(still, dir)
			continue
		}
		log := filepath.Join(dir, "log.jsonl")
		deleted := s.deletedLocked(dir)
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if p := filepath.Join(dir, e.Name()); p != log || deleted {
				if aside := p + ".gone-" + newTemplateID()[:6]; os.Rename(p, aside) == nil {
					gone = append(gone, aside)
				}
			}
		}
		if deleted {
			gone = append(gone, dir)
		}
	}
	s.st.Removing = still
	refs := map[string]bool{}
	for _, b := range kept {
		for _, id := range b.Layers {
			refs[id] = true
		}
	}
	busy := s.active > 0 // a running build may be about to use any layer
	_ = s.saveLocked()
	s.mu.Unlock()
	for _, p := range gone {
		_ = os.RemoveAll(p)
	}
	if busy {
		return 0
	}
	var freed int64
	cutoff := time.Now().Add(-maxAge)
	ls := s.cfg.Layers.List()
	slices.SortFunc(ls, func(a, b layers.Layer) int { return a.Used.Compare(b.Used) })
	for _, l := range ls {
		if refs[l.ID] || (l.Used.After(cutoff) && freed >= need) {
			continue
		}
		if err := s.cfg.Layers.Remove(l.ID); err != nil {
			s.log.Warn("removing layer", "layer", l.ID, "err", err)
			continue
		}
		freed += l.Size
	}
	files, _ := os.ReadDir(filepath.Join(s.cfg.Dir, "files"))
	for _, f := range files {
		if fi, err := f.Info(); err == nil && fi.ModTime().Before(cutoff) {
			_ = os.Remove(filepath.Join(s.cfg.Dir, "files", f.Name()))
		}
	}
	s.removeStaleAgentLayers()
	return freed
}

// removeGone removes what a collection renamed aside (`*.gone-*`, in
// builds/ and in each build's directory) and a crash kept it from removing.
func removeGone(builds string) {
	ents, _ := os.ReadDir(builds)
	for _, e := range ents {
		p := filepath.Join(builds, e.Name())
		if strings.Contains(e.Name(), ".gone-") {
			_ = os.RemoveAll(p)
			continue
		}
		if !e.IsDir() {
			continue
		}
		sub, _ := os.ReadDir(p)
		for _, f := range sub {
			if strings.Contains(f.Name(), ".gone-") {
				_ = os.RemoveAll(filepath.Join(p, f.Name()))
			}
		}
	}
}

// deletedLocked: dir belongs to no template any more (its log goes too).
func (s *Service) deletedLocked(dir string) bool {
	id := filepath.Base(dir)
	for _, t := range s.st.Templates {
		if t.build(id) != nil {
			return false
		}
	}
	return true
}

// removeStaleAgentLayers drops agent layers of other agent versions
// (they are remade on demand).
func (s *Service) removeStaleAgentLayers() {
	ents, _ := os.ReadDir(s.cfg.Layers.Dir())
	cur, err := s.cfg.Builder.AgentLayerName()
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "agent-") && e.Name() != cur {
			_ = os.RemoveAll(filepath.Join(s.cfg.Layers.Dir(), e.Name()))
		}
	}
}

// Usage is the disk used by custom templates, each file counted once
// (roots share their files with the layers).
type Usage struct {
	LayersBytes  int64 // layers not shared with a root
	BuildsBytes  int64 // roots and warm images
	UploadsBytes int64
	TotalBytes   int64
	CapBytes     int64 // 0: no cap
	Layers       int
}

// Usage measures the disk custom templates use.
func (s *Service) Usage() (Usage, error) {
	seen := map[[2]uint64]bool{}
	var u Usage
	var err error
	if u.BuildsBytes, err = layers.DiskUsage(seen, filepath.Join(s.cfg.Dir, "builds")); err != nil {
		return u, err
	}
	if u.LayersBytes, err = layers.DiskUsage(seen, s.cfg.Layers.Dir()); err != nil {
		return u, err
	}
	if u.UploadsBytes, err = layers.DiskUsage(seen, filepath.Join(s.cfg.Dir, "files")); err != nil {
		return u, err
	}
	u.TotalBytes = u.BuildsBytes + u.LayersBytes + u.UploadsBytes
	u.CapBytes = s.cfg.CapBytes
	u.Layers = len(s.cfg.Layers.List())
	return u, nil
}

// checkCap makes room under the disk cap before a build, collecting
// unused layers, or fails with ErrResourceExhausted.
func (s *Service) checkCap(ctx context.Context) error {
	if s.cfg.CapBytes <= 0 {
		return nil
	}
	u, err := s.Usage()
	if err != nil {
		return err
	}
	if u.TotalBytes < s.cfg.CapBytes {
		return nil
	}
	s.collectLayers(ctx, s.cfg.LayerTTL, u.TotalBytes-s.cfg.CapBytes+1)
	if u, err = s.Usage(); err != nil {
		return err
	}
	if u.TotalBytes >= s.cfg.CapBytes {
		return errdefs.New(errdefs.ErrResourceExhausted, "template storage is full: %d MiB used of the %d MiB cap (delete templates, or raise --template-cap-mb)",
			u.TotalBytes>>20, s.cfg.CapBytes>>20)
	}
	return nil
}

// rewarm remakes the warm image of a template's newest build for this
// daemon (another agent or boot configuration), then swaps it in.
func (s *Service) rewarm(templateID string) {
	s.mu.Lock()
	t := s.findLocked(context.Background(), templateID)
	var b *Build
	if t != nil {
		b = t.latestReady()
	}
	if b == nil {
		s.mu.Unlock()
		return
	}
	sp, c, limits, old, id, rootfs := specOf(b), b.Context, s.limitsOf(b), b.Image, b.ID, b.Rootfs
	s.mu.Unlock()
	s.slots <- struct{}{}
	defer func() { <-s.slots }()
	key, err := s.cfg.Builder.WarmKey(sp, c, limits)
	if err != nil {
		return
	}
	if err := s.cfg.Builder.InstallAgent(rootfs); err != nil {
		s.log.Error("re-warming template", "template.id", templateID, "err", err)
		return
	}
	image := filepath.Join(s.buildDir(id), "warm-"+key)
	lg := func(e build.Entry) { s.log.Debug("re-warm", "template.id", templateID, "msg", e.Message) }
	if err := s.cfg.Builder.Warm(s.stopped, rootfs, sp, c, limits, image, lg); err != nil {
		s.log.Error("re-warming template", "template.id", templateID, "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.findLocked(context.Background(), templateID); t == nil || t.latestReady() == nil || t.latestReady().ID != id {
		_ = os.RemoveAll(image)
		return
	}
	b.Image, b.WarmKey = image, key
	_ = s.saveLocked()
	s.cfg.Pool.UnwarmCustom(id)
	s.cfg.Pool.WarmCustom(s.resolvedLocked(t, b), s.cfg.PoolReady)
	if old != image {
		s.log.Info("template re-warmed for this daemon", "template.id", templateID)
		_ = os.RemoveAll(old) // sandboxes restored from it no longer need it
	}
}
