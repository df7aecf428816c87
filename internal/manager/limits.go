package manager

import (
	"fmt"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

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
//     (never raises: nothing else holds CAP_SYS_RESOURCE). Ready sandboxes
//     in the pool have the template's defaults applied while they wait, so
//     they serve creates asking for those or less; more restores the
//     template's image. A snapshot's processes cannot get more than the
//     snapshot had. The host's pids cgroup, which bounds gVisor's own
//     threads, is resized to match.

// templateLimits returns the default limits of a built-in template.
func (m *Manager) templateLimits(name string) sandbox.Limits {
	if l, ok := m.cfg.TemplateLimits[name]; ok {
		return l
	}
	return m.cfg.DefaultLimits
}

// limits returns a sandbox's limits, filling from the defaults what a
// record of an older daemon lacks.
func (m *Manager) limits(rec *sandbox.Sandbox) sandbox.Limits {
	return m.cfg.DefaultLimits.Over(rec.Limits())
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
