package manager

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFilesAreLayered keeps the package's files in layers: a file may use
// what the files below it declare (types, functions, methods, fields), and
// nothing below uses anything of a file above. It fails on every pair of
// files that use each other, with the names each takes from the other, and
// on longer loops; with -v it prints the layers, from the bottom.
func TestFilesAreLayered(t *testing.T) {
	refs := fileRefs(t)
	var pairs []string
	uses := map[string][]string{}
	for k, names := range refs {
		from, to := k[0], k[1]
		uses[from] = append(uses[from], to)
		if back, ok := refs[[2]string{to, from}]; ok && from < to {
			pairs = append(pairs, from+" uses "+strings.Join(names, ", ")+" of "+to+"; "+to+" uses "+strings.Join(back, ", ")+" of "+from)
		}
	}
	slices.Sort(pairs)
	for _, p := range pairs {
		t.Error(p)
	}
	// Peel the layers off from the bottom: a file whose uses are all
	// placed goes on the next layer. What never goes is in a loop.
	placed := map[string]bool{}
	for layer := 1; ; layer++ {
		var next []string
		for _, f := range files(t) {
			if !placed[f] && !slices.ContainsFunc(uses[f], func(to string) bool { return !placed[to] }) {
				next = append(next, f)
			}
		}
		if len(next) == 0 {
			break
		}
		for _, f := range next {
			placed[f] = true
		}
		t.Logf("layer %d: %s", layer, strings.Join(next, " "))
	}
	if left := slices.DeleteFunc(files(t), func(f string) bool { return placed[f] }); len(left) > 0 && len(pairs) == 0 {
		t.Errorf("these files use each other in a loop: %s", strings.Join(left, " "))
	}
}

// files returns the package's files, tests left out, sorted.
func files(t *testing.T) []string {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(names, func(n string) bool { return strings.HasSuffix(n, "_test.go") })
}

// fileRefs type-checks the package (without its tests) and returns, for
// each pair of files (from, to), the names from uses that to declares.
func fileRefs(t *testing.T) map[[2]string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}={{.Export}}", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	exports := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, file, _ := strings.Cut(line, "=")
		exports[path] = file
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, name := range files(t) {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
	}
	lookup := func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) }
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", lookup)}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	pkg, err := conf.Check("github.com/cellfork/cellfork/internal/manager", fset, parsed, info)
	if err != nil {
		t.Fatal(err)
	}
	refs := map[[2]string][]string{}
	for id, obj := range info.Uses {
		// Package-level names, and methods and fields (no scope of
		// their own); not locals.
		if obj.Pkg() != pkg || (obj.Parent() != pkg.Scope() && obj.Parent() != nil) {
			continue
		}
		from, to := fset.Position(id.Pos()).Filename, fset.Position(obj.Pos()).Filename
		if from == to {
			continue
		}
		k := [2]string{from, to}
		if !slices.Contains(refs[k], obj.Name()) {
			refs[k] = append(refs[k], obj.Name())
		}
	}
	for _, names := range refs {
		slices.Sort(names)
	}
	return refs
}
