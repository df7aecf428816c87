//go:build ignore

// gen.go precompiles gVisor's seccomp programs into a copy of the gVisor
// source tree, as the official (Bazel) build of runsc does. A `go install`
// build ships none, so every sandbox start and every restore compiles its
// filter from scratch: 10 ms idle, and 80 ms or more on a restore, where
// it competes with page loading (../shared/research/gvisor-cr.md §7).
//
// scripts/setup.sh runs it from the root of the copy:
//
//	go run gen.go
//
// It rewrites the two generated stubs, runsc/boot/filter (the sentry) and
// runsc/fsgofer/filter (the gofer), with the programs, names and variables
// the Bazel rule would embed. The sentry keeps only the programs for the
// way cellfork runs it (systrap, no GPU, TPU or RDMA proxy): 6 of 576,
// which keeps the build of runsc quick and its binary small.
package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	sentry "gvisor.dev/gvisor/runsc/boot/filter/config"
	gofer "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

func main() {
	for _, t := range []struct {
		file     string
		programs func() ([]precompiledseccomp.Program, error)
		keep     func(name string) bool
	}{
		{"runsc/boot/filter/filter_precompiled.go", sentry.PrecompiledPrograms, func(name string) bool {
			return strings.Contains(name, `Platform="systrap"`) &&
				strings.Contains(name, "NVProxy=false NVProxyCaps= TPUProxy=false RDMAProxy=false")
		}},
		{"runsc/fsgofer/filter/filter_precompiled.go", gofer.PrecompiledPrograms, func(string) bool { return true }},
	} {
		if err := write(t.file, t.programs, t.keep); err != nil {
			fmt.Fprintf(os.Stderr, "seccompgen: %s: %v\n", t.file, err)
			os.Exit(1)
		}
	}
}

// write replaces the stub's empty registration with the programs.
func write(file string, programs func() ([]precompiledseccomp.Program, error), keep func(string) bool) error {
	src, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	const stub = "\tprograms := make(map[string]precompiledseccomp.Program)\n"
	text := string(src)
	if !strings.Contains(text, stub) || !strings.Contains(text, "PrecompilationDisabledAtBuildTime = true") {
		return fmt.Errorf("not the stub this generator knows (gVisor changed?)")
	}
	all, err := programs()
	if err != nil {
		return err
	}
	var progs []precompiledseccomp.Program
	for _, p := range all {
		if keep(p.Name) {
			progs = append(progs, p)
		}
	}
	if len(progs) == 0 {
		return fmt.Errorf("none of the %d programs is for cellfork's flags (gVisor changed?)", len(all))
	}
	slices.SortFunc(progs, func(a, b precompiledseccomp.Program) int { return strings.Compare(a.Name, b.Name) })
	var b strings.Builder
	b.WriteString(stub)
	for _, p := range progs {
		b.WriteString(p.Registration("\t", "precompiledseccomp", "programs"))
	}
	text = strings.Replace(text, stub, b.String(), 1)
	text = strings.Replace(text, "PrecompilationDisabledAtBuildTime = true", "PrecompilationDisabledAtBuildTime = false", 1)
	fmt.Printf("seccompgen: %d of %d programs into %s\n", len(progs), len(all), file)
	return os.WriteFile(file, []byte(text), 0o644)
}
