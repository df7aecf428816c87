package manager

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
)

// What a new sandbox starts from, and with which limits.

// How each limit reaches a sandbox, whatever path starts it:
//
//   - CPU and memory are the host cgroups of the gVisor sandbox, which
//     gVisor also reads once, when the sandbox starts or is prepared, to
//     size the CPUs and memory it shows inside. So a ready sandbox from the
//     pool (or a prepared shell) only serves a create that asks for the
//     CPUs and memory it was started with; otherwise the image is restored
//     into a new sandbox of the right size.
//   - The disk (the root overlay and /dev/shm, both in sandbox memory) is
//     sized when a sandbox boots and then frozen in every image of it. A
//     template create asking for another size than the template's boots;
//     a snapshot's sandboxes keep the snapshot's size.
//   - Processes and open files are per-process limits, also frozen in
//     images. Images of templates are booted with the daemon's maximums;
//     at hand-off the agent sets the sandbox's limits on itself (its
//     children inherit them) and lowers them on every running process
//     (never raises: nothing else holds CAP_SYS_RESOURCE), unless they
//     have them already (an image of a sandbox with the same ones: a
//     snapshot, a fork's parent, a paused sandbox). Ready sandboxes
//     in the pool have the template's defaults applied while they wait, so
//     they serve creates asking for those or less; more restores the
//     template's image. A snapshot's processes cannot get more than the
//     snapshot had. The host's pids cgroup, which bounds gVisor's own
//     threads, is resized to match.

// source is what a new sandbox starts from: a built-in template (its warm
// image, or a boot if it has none) or a snapshot.
type source struct {
	template string // built-in template name; "" for a snapshot
	snapshot *sandbox.Snapshot
	rootfs   string
	image    string // checkpoint to restore; "" = boot
	// limits are the source's: the template's defaults (its warm image's
	// disk size among them), or the snapshot's.
	limits sandbox.Limits
	// custom is the id of a custom template (CustomTemplates): its warm image
	// runs its start command, so its disk size is frozen as a snapshot's.
	custom string
}

// resolve maps a template id to a source: built-in names and aliases
// first, then snapshot ids and names.
func (m *Manager) resolve(ctx context.Context, id string) (source, error) {
	if name, err := template.Resolve(id); err == nil {
		rootfs, err := m.tpl.Rootfs(ctx, name, io.Discard)
		if err != nil {
			return source{}, err
		}
		src := source{template: name, rootfs: rootfs, limits: m.templateLimits(name)}
		if w, ok := m.pool.Warm(name); ok && w.Rootfs == rootfs {
			src.image = w.Image
		}
		return src, nil
	}
	if src, ok, err := m.resolveCustom(ctx, id); ok || err != nil {
		return src, err
	}
	sn, err := m.snaps.Source(ctx, id)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return source{}, err
	}
	if err != nil {
		return source{}, errdefs.New(errdefs.ErrNotFound, "template or snapshot %q not found (built-in templates: base, code-interpreter-v1)", id)
	}
	return source{snapshot: sn, rootfs: sn.Rootfs, image: sn.Image, limits: m.cfg.DefaultLimits.Over(sn.Limits())}, nil
}

// resolveCustom maps id to a custom template's source; ok is false when id
// names none.
func (m *Manager) resolveCustom(ctx context.Context, id string) (source, bool, error) {
	if m.custom == nil {
		return source{}, false, nil
	}
	t, err := m.custom.ResolveTemplate(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return source{}, false, nil
	}
	if err != nil {
		return source{}, false, err
	}
	return source{template: t.Key, rootfs: t.Rootfs, image: t.Image, limits: m.cfg.DefaultLimits.Over(t.Limits), custom: id}, true, nil
}

// createLimits layers a create's limits over what its source gives and
// checks them: within the daemon's minimums and maximums, and for a
// snapshot, within what its image holds.
func (m *Manager) createLimits(src source, want sandbox.Limits) (sandbox.Limits, error) {
	l := src.limits.Over(want)
	if err := l.Check(m.cfg.MaxLimits); err != nil {
		return l, errdefs.New(errdefs.ErrInvalidArgument, "%v", err)
	}
	if src.custom != "" {
		if err := frozenFits(fmt.Sprintf("template %s", src.custom), sandbox.Limits{DiskMB: src.limits.DiskMB}, l); err != nil {
			return l, errdefs.New(errdefs.ErrInvalidArgument, "%v", err)
		}
	}
	if sn := src.snapshot; sn != nil {
		if err := frozenFits(fmt.Sprintf("snapshot %s", sn.ID), src.limits, l); err != nil {
			return l, errdefs.New(errdefs.ErrInvalidArgument, "%v", err)
		}
	}
	return l, nil
}

// frozenFits checks that a sandbox with limits l can run an image of a
// sandbox that had img: same disk size, and no more processes or open files
// (its processes keep their limits, which can be lowered, not raised).
func frozenFits(what string, img, l sandbox.Limits) error {
	switch {
	case img.DiskMB != 0 && l.DiskMB != img.DiskMB:
		return fmt.Errorf("diskSizeMB must be %d, the disk size frozen in %s", img.DiskMB, what)
	case img.PidsMax != 0 && l.PidsMax > img.PidsMax:
		return fmt.Errorf("pidsMax must be at most %d, the process limit of %s (its processes keep their limits; they can be lowered, not raised)", img.PidsMax, what)
	case img.OpenFiles != 0 && l.OpenFiles > img.OpenFiles:
		return fmt.Errorf("openFiles must be at most %d, the open-file limit of %s (its processes keep their limits; they can be lowered, not raised)", img.OpenFiles, what)
	}
	return nil
}

// rlimitsFit reports whether a box whose agent applied have (zero: none,
// the image's maximums) can be given process limits want: lowering, not
// raising.
func rlimitsFit(have, want sandbox.Limits) bool {
	return have == (sandbox.Limits{}) || want.PidsMax <= have.PidsMax && want.OpenFiles <= have.OpenFiles
}
