// Package dockerfile turns a Dockerfile into template build steps, as E2B's
// SDKs do for Template().from_dockerfile(): FROM is the base image, RUN,
// COPY, ADD (local files), ENV, WORKDIR and USER become steps, ARG values
// are substituted, CMD and ENTRYPOINT become the start command and
// HEALTHCHECK CMD its ready check. Parsing and variable expansion are
// BuildKit's (the Docker builder's own parser); only the mapping is ours.
package dockerfile

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Step is one build step (E2B's TemplateStep without the files hash, which
// the caller sets on COPY steps).
type Step struct {
	Type string
	Args []string
}

// Template is what a Dockerfile makes.
type Template struct {
	FromImage string
	Steps     []Step
	StartCmd  string // CMD / ENTRYPOINT; "" if none
	ReadyCmd  string // HEALTHCHECK CMD; "" if none
	Warnings  []string
}

// maxSize bounds the Dockerfile read.
const maxSize = 1 << 20

func invalid(line int, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if line > 0 {
		msg = fmt.Sprintf("Dockerfile line %d: %s", line, msg)
	}
	return errdefs.New(errdefs.ErrInvalidArgument, "%s", msg)
}

// vars is the ARG and ENV values in scope, for expansion.
type vars map[string]string

func (v vars) Get(k string) (string, bool) { s, ok := v[k]; return s, ok }
func (v vars) Keys() []string              { return slices.Sorted(maps.Keys(v)) }

// Parse converts text. buildArgs set ARG values (an ARG the Dockerfile does
// not declare is ignored, as by docker build).
func Parse(text string, buildArgs map[string]string) (*Template, error) {
	if len(text) > maxSize {
		return nil, invalid(0, "the Dockerfile is larger than %d bytes", maxSize)
	}
	res, err := parser.Parse(strings.NewReader(text))
	if err != nil {
		return nil, invalid(0, "%v", err)
	}
	lex := shell.NewLex(res.EscapeToken)
	t := &Template{}
	for _, w := range res.Warnings {
		t.Warnings = append(t.Warnings, w.Short)
	}
	scope := vars{}
	froms := 0
	var entrypoint, cmd []string
	var entryShell, cmdShell bool
	sawUser, sawWorkdir := false, false
	expand := func(n *parser.Node, s string) (string, error) {
		out, _, err := lex.ProcessWord(s, scope)
		if err != nil {
			return "", invalid(n.StartLine, "%v", err)
		}
		return out, nil
	}
	for _, n := range res.AST.Children {
		args := nodeArgs(n)
		json := n.Attributes["json"]
		line := n.StartLine
		switch kw := strings.ToLower(n.Value); kw {
		case "arg":
			for _, a := range args {
				name, def, hasDef := strings.Cut(a, "=")
				if v, ok := buildArgs[name]; ok {
					scope[name] = v
				} else if hasDef {
					v, err := expand(n, def)
					if err != nil {
						return nil, err
					}
					scope[name] = v
				} else if _, ok := scope[name]; !ok {
					scope[name] = ""
				}
			}
		case "from":
			froms++
			if froms > 1 {
				return nil, invalid(line, "multi-stage Dockerfiles (a second FROM) are not supported: build the stage you need, then FROM that template")
			}
			if len(n.Flags) > 0 {
				return nil, invalid(line, "FROM flags (%s) are not supported", strings.Join(n.Flags, " "))
			}
			if len(args) == 0 {
				return nil, invalid(line, "FROM needs an image")
			}
			img, err := expand(n, args[0])
			if err != nil {
				return nil, err
			}
			if img == "" {
				return nil, invalid(line, "FROM %s names no image", args[0])
			}
			if img == "scratch" {
				return nil, invalid(line, "FROM scratch is not supported: a template needs a shell and a user database")
			}
			t.FromImage = img
			// Docker's defaults, which the image's own USER and WORKDIR do
			// not change for the steps (as E2B's SDKs do).
			t.Steps = append(t.Steps, Step{"USER", []string{"root"}}, Step{"WORKDIR", []string{"/"}})
		default:
			if froms == 0 && kw != "arg" {
				return nil, invalid(line, "%s before FROM", strings.ToUpper(kw))
			}
		}
		switch kw := strings.ToLower(n.Value); kw {
		case "arg", "from":
		case "run":
			if len(n.Flags) > 0 {
				return nil, invalid(line, "RUN flags (%s) are not supported", strings.Join(n.Flags, " "))
			}
			c := joinCommand(args, json)
			if c == "" {
				return nil, invalid(line, "RUN needs a command")
			}
			// The command's own shell expands its variables; ENV values are
			// in its environment, ARG values are set in front of it.
			if prefix := argPrefix(scope, t); prefix != "" {
				c = prefix + c
			}
			t.Steps = append(t.Steps, Step{"RUN", []string{c}})
		case "env":
			// The parser gives name, value, separator triples.
			if len(args) == 0 || len(args)%3 != 0 {
				return nil, invalid(line, "ENV needs name=value pairs")
			}
			var kv []string
			for i := 0; i < len(args); i += 3 {
				v, err := expand(n, args[i+1])
				if err != nil {
					return nil, err
				}
				scope[args[i]] = v
				kv = append(kv, args[i], v)
			}
			t.Steps = append(t.Steps, Step{"ENV", kv})
		case "copy", "add":
			owner, mode := "", ""
			for _, f := range n.Flags {
				name, v, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
				switch name {
				case "chown":
					owner = v
				case "chmod":
					mode = v
				case "link":
				default:
					return nil, invalid(line, "%s --%s is not supported (only --chown and --chmod)", strings.ToUpper(kw), name)
				}
			}
			if len(args) < 2 {
				return nil, invalid(line, "%s needs a source and a destination", strings.ToUpper(kw))
			}
			words := make([]string, len(args))
			for i, a := range args {
				v, err := expand(n, a)
				if err != nil {
					return nil, err
				}
				words[i] = v
			}
			dest := words[len(words)-1]
			for _, src := range words[:len(words)-1] {
				if kw == "add" && (strings.Contains(src, "://") || strings.HasPrefix(src, "git@")) {
					return nil, invalid(line, "ADD of a URL is not supported: RUN curl (or git clone) instead")
				}
				if strings.HasPrefix(src, "/") || slices.Contains(strings.Split(src, "/"), "..") {
					return nil, invalid(line, "%s source %q must be inside the build context", strings.ToUpper(kw), src)
				}
				t.Steps = append(t.Steps, Step{"COPY", []string{src, dest, owner, mode}})
			}
		case "workdir":
			if len(args) != 1 {
				return nil, invalid(line, "WORKDIR needs one path")
			}
			d, err := expand(n, args[0])
			if err != nil {
				return nil, err
			}
			sawWorkdir = true
			t.Steps = append(t.Steps, Step{"WORKDIR", []string{d}})
		case "user":
			if len(args) != 1 {
				return nil, invalid(line, "USER needs one user")
			}
			u, err := expand(n, args[0])
			if err != nil {
				return nil, err
			}
			if name, _, hasGroup := strings.Cut(u, ":"); hasGroup {
				t.Warnings = append(t.Warnings, fmt.Sprintf("line %d: USER's group is ignored; commands run with %s's groups", line, name))
				u = name
			}
			sawUser = true
			t.Steps = append(t.Steps, Step{"USER", []string{u}})
		case "cmd":
			cmd, cmdShell = args, !json
		case "entrypoint":
			entrypoint, entryShell = args, !json
		case "healthcheck":
			if len(args) > 0 && strings.EqualFold(args[0], "NONE") {
				t.ReadyCmd = ""
				break
			}
			if len(args) > 1 && strings.EqualFold(args[0], "CMD") {
				t.ReadyCmd = joinCommand(args[1:], json)
			}
		case "expose", "label", "maintainer", "stopsignal", "volume", "shell", "onbuild":
			t.Warnings = append(t.Warnings, fmt.Sprintf("line %d: %s is ignored", line, strings.ToUpper(kw)))
		default:
			return nil, invalid(line, "unknown instruction %s", strings.ToUpper(kw))
		}
	}
	if froms == 0 {
		return nil, invalid(0, "the Dockerfile has no FROM")
	}
	// CMD and ENTRYPOINT combine as docker run combines them.
	switch {
	case len(entrypoint) > 0 && entryShell:
		t.StartCmd = joinCommand(entrypoint, false)
	case len(entrypoint) > 0:
		t.StartCmd = joinCommand(append(slices.Clone(entrypoint), cmdArgs(cmd, cmdShell)...), true)
	case len(cmd) > 0:
		t.StartCmd = joinCommand(cmd, !cmdShell)
	}
	// E2B's defaults after the Dockerfile: commands run as `user` in its
	// home unless the Dockerfile chose.
	if !sawUser {
		t.Steps = append(t.Steps, Step{"USER", []string{"user"}})
	}
	if !sawWorkdir {
		t.Steps = append(t.Steps, Step{"WORKDIR", []string{"/home/user"}})
	}
	return t, nil
}

// nodeArgs are an instruction's words.
func nodeArgs(n *parser.Node) []string {
	var out []string
	for a := n.Next; a != nil; a = a.Next {
		out = append(out, a.Value)
	}
	return out
}

// cmdArgs is CMD as arguments to an exec-form ENTRYPOINT (a shell-form
// CMD becomes `/bin/sh -c CMD`, as Docker does).
func cmdArgs(cmd []string, shellForm bool) []string {
	if shellForm && len(cmd) > 0 {
		return []string{"/bin/sh", "-c", cmd[0]}
	}
	return cmd
}

// joinCommand turns a shell form (one string) or an exec form (JSON
// array) into one shell command line.
func joinCommand(args []string, execForm bool) string {
	if !execForm {
		return strings.Join(args, " ")
	}
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = quote(a)
	}
	return strings.Join(q, " ")
}

// quote makes s one shell word (unquoted when it is plain).
func quote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// argPrefix sets the ARG values (not ENV's: those are in the environment)
// in front of a RUN command, as Docker gives them to RUN.
func argPrefix(scope vars, t *Template) string {
	envs := map[string]bool{}
	for _, st := range t.Steps {
		if st.Type == "ENV" {
			for i := 0; i < len(st.Args); i += 2 {
				envs[st.Args[i]] = true
			}
		}
	}
	var kv []string
	for _, k := range scope.Keys() {
		if !envs[k] && validName(k) {
			kv = append(kv, k+"="+quote(scope[k]))
		}
	}
	if len(kv) == 0 {
		return ""
	}
	return "export " + strings.Join(kv, " ") + "; "
}

func validName(k string) bool {
	for i, r := range k {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return k != ""
}
