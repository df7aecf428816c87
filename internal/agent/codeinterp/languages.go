package codeinterp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// The languages of code contexts, named as E2B names them.
const (
	Python     = "python"
	JavaScript = "javascript"
	TypeScript = "typescript"
	R          = "r"
	Java       = "java"
	Bash       = "bash"
)

// Languages lists every language, in the order the docs give them.
var Languages = []string{Python, JavaScript, TypeScript, R, Java, Bash}

// defaultLanguages have a default context from the start, as in E2B's
// code interpreter (which starts their kernels at boot; ours start on first
// use).
var defaultLanguages = []string{Python, JavaScript}

// normalizeLanguage maps a request's language to one of Languages: as E2B,
// case and surrounding space do not matter, "" is python, "js" and "ts" are
// aliases; "python3" is ours.
func normalizeLanguage(lang string) (string, error) {
	l := strings.ToLower(strings.TrimSpace(lang))
	switch l {
	case "", "python3":
		return Python, nil
	case "js":
		return JavaScript, nil
	case "ts":
		return TypeScript, nil
	}
	for _, known := range Languages {
		if l == known {
			return l, nil
		}
	}
	return "", fmt.Errorf("language %q is not supported (supported: %s): %w",
		lang, strings.Join(Languages, ", "), errInvalid)
}

// kernelFile is each language's driver, in the kernels' directory (the
// template package installs them: template.AgentFiles).
var kernelFile = map[string]string{
	Python:     "kernel.py",
	JavaScript: "kernel.js",
	TypeScript: "kernel.js",
	R:          "kernel.R",
	Java:       "kernel.java",
	Bash:       "kernel.sh",
}

// runtimeBinary is the program each language's kernel runs on.
var runtimeBinary = map[string]string{
	JavaScript: "node",
	TypeScript: "node",
	R:          "Rscript",
	Java:       "java",
	Bash:       "bash",
}

// javaOptions keep a kernel's JVM small and quick to start: it compiles
// snippets more than it runs hot loops.
var javaOptions = []string{"-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"}

// argv returns the command line of a kernel for lang.
func (i *Interpreter) argv(ctx context.Context, lang string) ([]string, error) {
	script := filepath.Join(i.kernelDir, kernelFile[lang])
	if lang == Python {
		return []string{i.python, script}, nil
	}
	bin, err := lookPath(runtimeBinary[lang])
	if err != nil {
		return nil, fmt.Errorf("%s contexts need %s, which this sandbox does not have: %w",
			lang, runtimeBinary[lang], errUnavailable)
	}
	switch lang {
	case TypeScript:
		return []string{bin, script, "typescript"}, nil
	case Bash:
		return []string{bin, "--noprofile", "--norc", script}, nil
	case Java:
		if dir := i.javaClasses(ctx, bin, script); dir != "" {
			return append(append([]string{bin}, javaOptions...), "-cp", dir, "kernel"), nil
		}
		return append(append([]string{bin}, javaOptions...), script), nil // source-file mode
	}
	return []string{bin, script}, nil
}

// lookPath finds a program in the kernels' PATH.
func lookPath(name string) (string, error) {
	for _, dir := range filepath.SplitList(defaultPath) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

// javaCache compiles the Java kernel once per sandbox: run from source, a
// JVM spends about a second and a half compiling it on every start.
type javaCache struct {
	mu  sync.Mutex
	dir string // "" until compiled
}

// javaClasses returns a directory holding the compiled Java kernel,
// compiling it first if needed, or "" if that failed (the kernel then runs
// from source).
func (i *Interpreter) javaClasses(ctx context.Context, java, script string) string {
	c := &i.java
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dir != "" {
		return c.dir
	}
	src, err := os.ReadFile(script)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(src)
	dir := filepath.Join(i.cacheDir, "java-"+hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, "kernel.class")); err == nil {
		c.dir = dir
		return dir
	}
	javac := filepath.Join(filepath.Dir(java), "javac")
	if resolved, err := filepath.EvalSymlinks(java); err == nil {
		javac = filepath.Join(filepath.Dir(resolved), "javac")
	}
	if err := os.MkdirAll(i.cacheDir, 0o755); err != nil {
		return ""
	}
	tmp, err := os.MkdirTemp(i.cacheDir, ".java-")
	if err != nil {
		return ""
	}
	defer os.RemoveAll(tmp)
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(cctx, javac, "-J-XX:+UseSerialGC", "-J-XX:TieredStopAtLevel=1",
		"-nowarn", "-d", tmp, script).CombinedOutput()
	if err == nil {
		err = os.Chmod(tmp, 0o755)
	}
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		i.log.Warn("compiling the Java kernel; it runs from source", "err", err, "output", string(out))
		return ""
	}
	c.dir = dir
	return dir
}

// available reports whether this sandbox has lang's runtime.
func (i *Interpreter) available(lang string) error {
	if lang == Python {
		return nil
	}
	if _, err := lookPath(runtimeBinary[lang]); err != nil {
		return fmt.Errorf("%s contexts need %s, which this sandbox does not have: %w",
			lang, runtimeBinary[lang], errUnavailable)
	}
	return nil
}
