package sandbox

import (
	"strings"
	"testing"
)

func TestLimitsOverAndField(t *testing.T) {
	base := Limits{CPUCount: 1, MemoryMB: 1024, DiskMB: 512, PidsMax: 512, OpenFiles: 65536}
	got := base.Over(Limits{MemoryMB: 2048, OpenFiles: 1000})
	want := Limits{CPUCount: 1, MemoryMB: 2048, DiskMB: 512, PidsMax: 512, OpenFiles: 1000}
	if got != want {
		t.Errorf("Over = %+v, want %+v", got, want)
	}
	if base.Over(Limits{}) != base {
		t.Error("Over of nothing changed the limits")
	}
	for _, n := range LimitNames {
		if base.Field(n) == nil {
			t.Errorf("no field %q", n)
		}
	}
	if base.Field("cpus") != nil {
		t.Error("Field of an unknown name is not nil")
	}
}

func TestLimitsCheck(t *testing.T) {
	max := Limits{CPUCount: 2, MemoryMB: 4096, DiskMB: 1024, PidsMax: 1024, OpenFiles: 1 << 20}
	ok := Limits{CPUCount: 2, MemoryMB: 128, DiskMB: 1024, PidsMax: 16, OpenFiles: 256}
	if err := ok.Check(max); err != nil {
		t.Fatalf("limits at the bounds: %v", err)
	}
	for _, tc := range []struct {
		change func(*Limits)
		want   string
	}{
		{func(l *Limits) { l.CPUCount = 3 }, "cpuCount must be between 1 and 2, not 3"},
		{func(l *Limits) { l.CPUCount = 0 }, "cpuCount must be between 1 and 2, not 0"},
		{func(l *Limits) { l.MemoryMB = 127 }, "memoryMB must be between 128 and 4096"},
		{func(l *Limits) { l.DiskMB = 1025 }, "diskSizeMB must be between 16 and 1024"},
		{func(l *Limits) { l.PidsMax = -1 }, "pidsMax must be between 16 and 1024"},
		{func(l *Limits) { l.OpenFiles = 255 }, "openFiles must be between 256 and 1048576"},
	} {
		l := ok
		tc.change(&l)
		if err := l.Check(max); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%+v) = %v, want %q", l, err, tc.want)
		}
	}
}
