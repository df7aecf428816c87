package manager

import (
	"errors"
	"strings"
	"testing"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

var (
	testDefaults = sandbox.Limits{CPUCount: 1, MemoryMB: 1024, DiskMB: 512, PidsMax: 512, OpenFiles: 65536}
	testMax      = sandbox.Limits{CPUCount: 2, MemoryMB: 4096, DiskMB: 2048, PidsMax: 4096, OpenFiles: 1 << 20}
)

func limitsManager() *Manager {
	return &Manager{cfg: Config{DefaultLimits: testDefaults, MaxLimits: testMax,
		TemplateLimits: map[string]sandbox.Limits{"base": testDefaults.Over(sandbox.Limits{DiskMB: 300})}}}
}

func TestCreateLimits(t *testing.T) {
	m := limitsManager()
	tpl := source{template: "base", limits: m.templateLimits("base")}
	snap := source{snapshot: &sandbox.Snapshot{ID: "snapx"}, limits: testDefaults}
	for _, tc := range []struct {
		name string
		src  source
		want sandbox.Limits
		out  sandbox.Limits
		err  string
	}{
		{name: "template defaults", src: tpl, out: testDefaults.Over(sandbox.Limits{DiskMB: 300})},
		{name: "every override", src: tpl, want: testMax, out: testMax},
		{name: "above max", src: tpl, want: sandbox.Limits{MemoryMB: 4097}, err: "memoryMB must be between 128 and 4096, not 4097"},
		{name: "below min", src: tpl, want: sandbox.Limits{PidsMax: 8}, err: "pidsMax must be between 16 and 4096"},
		{name: "snapshot inherits", src: snap, out: testDefaults},
		{name: "snapshot lowered", src: snap, want: sandbox.Limits{PidsMax: 64, OpenFiles: 1000, MemoryMB: 2048, CPUCount: 2},
			out: sandbox.Limits{CPUCount: 2, MemoryMB: 2048, DiskMB: 512, PidsMax: 64, OpenFiles: 1000}},
		{name: "snapshot pids raised", src: snap, want: sandbox.Limits{PidsMax: 513}, err: "pidsMax must be at most 512, the process limit of snapshot snapx"},
		{name: "snapshot files raised", src: snap, want: sandbox.Limits{OpenFiles: 65537}, err: "openFiles must be at most 65536"},
		{name: "snapshot other disk", src: snap, want: sandbox.Limits{DiskMB: 1024}, err: "diskSizeMB must be 512, the disk size frozen in snapshot snapx"},
	} {
		got, err := m.createLimits(tc.src, tc.want)
		switch {
		case tc.err != "":
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want %q", tc.name, err, tc.err)
			}
		case err != nil || got != tc.out:
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.out)
		}
	}
}

// A ready sandbox in the pool has the template's process limits applied:
// it serves creates asking for those or less, not more.
func TestRlimitsFit(t *testing.T) {
	have := sandbox.Limits{PidsMax: 512, OpenFiles: 65536}
	for _, tc := range []struct {
		have, want sandbox.Limits
		fit        bool
	}{
		{have, have, true},
		{have, sandbox.Limits{PidsMax: 16, OpenFiles: 256}, true},
		{have, sandbox.Limits{PidsMax: 513, OpenFiles: 256}, false},
		{have, sandbox.Limits{PidsMax: 16, OpenFiles: 65537}, false},
		{sandbox.Limits{}, testMax, true}, // nothing applied yet: the image has the maximums
	} {
		if got := rlimitsFit(tc.have, tc.want); got != tc.fit {
			t.Errorf("rlimitsFit(%+v, %+v) = %v", tc.have, tc.want, got)
		}
	}
}

// An image of a sandbox from an older daemon (limits unknown) fits anything.
func TestFrozenFitsUnknown(t *testing.T) {
	if err := frozenFits("snapshot s", sandbox.Limits{}, testMax); err != nil {
		t.Error(err)
	}
}
