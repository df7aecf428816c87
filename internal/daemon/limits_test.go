package daemon

import (
	"errors"
	"strings"
	"testing"

	"github.com/cellfork/cellfork/internal/manager"
	"github.com/cellfork/cellfork/internal/sandbox"
)

func limitsConfig() Config {
	return Config{Config: manager.Config{
		DefaultLimits: sandbox.Limits{CPUCount: 1, MemoryMB: 1024, DiskMB: 512, PidsMax: 512, OpenFiles: 65536},
		MaxLimits:     sandbox.Limits{CPUCount: 2, MemoryMB: 8192, DiskMB: 4096, PidsMax: 4096, OpenFiles: 1 << 20},
	}}
}

func TestValidateLimits(t *testing.T) {
	c := limitsConfig()
	if errs := c.validateLimits(); len(errs) != 0 {
		t.Fatalf("defaults refused: %v", errs)
	}
	for _, tc := range []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.DefaultLimits.CPUCount = 3 }, "--default-cpus must be between 1 and --max-cpus (2)"},
		{func(c *Config) { c.DefaultLimits.DiskMB = 8 }, "--disk-mb must be between 16 and --max-disk-mb (4096)"},
		{func(c *Config) { c.MaxLimits.PidsMax = 10 }, "--max-pids must be at least 16"},
		{func(c *Config) { c.DefaultLimits.OpenFiles = 100 }, "--open-files must be between 256"},
		{func(c *Config) { c.MaxLimits.OpenFiles = 1 << 21 }, "--max-open-files must be at most 1048576"},
		{func(c *Config) { c.TemplateOverrides = map[string]sandbox.Limits{"base": {MemoryMB: 9000}} },
			"template base: memoryMB must be between 128 and 8192, not 9000"},
		{func(c *Config) { c.TemplateOverrides = map[string]sandbox.Limits{"nope": {MemoryMB: 512}} }, `template "nope" not found`},
	} {
		c := limitsConfig()
		tc.change(&c)
		if err := errors.Join(c.validateLimits()...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
}

// A template's defaults: the daemon's, then the template's own file, then
// the operator's --template-limits.
func TestTemplateLimitsLayering(t *testing.T) {
	c := limitsConfig()
	c.TemplateOverrides = map[string]sandbox.Limits{"base": {DiskMB: 300, PidsMax: 200}}
	got, err := c.templateLimits()
	if err != nil {
		t.Fatal(err)
	}
	want := sandbox.Limits{CPUCount: 1, MemoryMB: 1024, DiskMB: 300, PidsMax: 200, OpenFiles: 65536}
	if got["base"] != want {
		t.Errorf("base: %+v, want %+v", got["base"], want)
	}
}
