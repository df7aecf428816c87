package daemon

import (
	"fmt"

	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
)

// limitFlags names the flags that set each limit's default and maximum.
var limitFlags = map[string][2]string{
	"cpuCount":   {"--default-cpus", "--max-cpus"},
	"memoryMB":   {"--default-memory-mb", "--max-memory-mb"},
	"diskSizeMB": {"--disk-mb", "--max-disk-mb"},
	"pidsMax":    {"--pids-max", "--max-pids"},
	"openFiles":  {"--open-files", "--max-open-files"},
}

// validateLimits checks the maximums, the defaults and every template's
// values, naming the flag or template at fault.
func (c *Config) validateLimits() []error {
	var errs []error
	lo := sandbox.MinLimits
	for _, n := range sandbox.LimitNames {
		def, max, min := *c.DefaultLimits.Field(n), *c.MaxLimits.Field(n), *lo.Field(n)
		flags := limitFlags[n]
		if max < min {
			errs = append(errs, fmt.Errorf("%s must be at least %d", flags[1], min))
		} else if def < min || def > max {
			errs = append(errs, fmt.Errorf("%s must be between %d and %s (%d)", flags[0], min, flags[1], max))
		}
	}
	if c.MaxLimits.OpenFiles > sandbox.MaxOpenFiles {
		errs = append(errs, fmt.Errorf("--max-open-files must be at most %d (gVisor's limit)", sandbox.MaxOpenFiles))
	}
	if len(errs) > 0 {
		return errs
	}
	if _, err := c.templateLimits(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// templateLimits returns every built-in template's default limits: the
// daemon's defaults, then the template's own values, then the operator's
// (--template-limits).
func (c *Config) templateLimits() (map[string]sandbox.Limits, error) {
	for name := range c.TemplateOverrides {
		if _, err := template.Resolve(name); err != nil {
			return nil, fmt.Errorf("--template-limits: %w", err)
		}
	}
	out := map[string]sandbox.Limits{}
	for _, name := range template.Names() {
		own, err := template.Limits(name)
		if err != nil {
			return nil, err
		}
		l := c.DefaultLimits.Over(own).Over(c.TemplateOverrides[name])
		if err := l.Check(c.MaxLimits); err != nil {
			return nil, fmt.Errorf("template %s: %w (see templates/%s/limits and --template-limits)", name, err, name)
		}
		out[name] = l
	}
	return out, nil
}
