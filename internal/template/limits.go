package template

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/templates"
)

// Limits returns the resource defaults the template's definition sets
// (<name>/limits; zero fields: not set, and none if it has no such file).
// They are not part of the template's hash: changing them rebuilds no
// rootfs.
func Limits(name string) (sandbox.Limits, error) {
	b, err := fs.ReadFile(templates.FS, name+"/limits")
	if errors.Is(err, fs.ErrNotExist) {
		return sandbox.Limits{}, nil
	}
	if err != nil {
		return sandbox.Limits{}, err
	}
	var pairs []string
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.Contains(line, "=") {
			return sandbox.Limits{}, fmt.Errorf("template %s: limits line %d: want name = value, got %q", name, i+1, line)
		}
		pairs = append(pairs, line)
	}
	l, err := parsePairs(pairs)
	if err != nil {
		return sandbox.Limits{}, fmt.Errorf("template %s: limits: %w", name, err)
	}
	return l, nil
}

// ParseLimitsFlag parses an operator's per-template values,
// "NAME:key=value,key=value" (keys as in the create body), into the
// template name (resolved, so aliases work) and its limits.
func ParseLimitsFlag(v string) (string, sandbox.Limits, error) {
	id, rest, ok := strings.Cut(v, ":")
	if !ok || rest == "" {
		return "", sandbox.Limits{}, fmt.Errorf("%q: want TEMPLATE:name=value,...", v)
	}
	name, err := Resolve(id)
	if err != nil {
		return "", sandbox.Limits{}, err
	}
	l, err := parsePairs(strings.Split(rest, ","))
	if err != nil {
		return "", sandbox.Limits{}, fmt.Errorf("%q: %w", v, err)
	}
	return name, l, nil
}

// parsePairs reads "name = value" pairs; every value must be positive.
func parsePairs(pairs []string) (sandbox.Limits, error) {
	var l sandbox.Limits
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		f := l.Field(k)
		if f == nil {
			return l, fmt.Errorf("unknown limit %q (known: %s)", k, strings.Join(sandbox.LimitNames, ", "))
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return l, fmt.Errorf("%s must be a positive integer, not %q", k, v)
		}
		*f = n
	}
	return l, nil
}
