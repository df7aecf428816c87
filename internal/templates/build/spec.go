// Package build runs custom template builds: the base (an image pulled
// from a registry or read from an archive, the built-in template's root, or
// another custom template), then each step in a gVisor sandbox whose root
// is an overlay of the layers below (so the build's own code is as
// contained as any sandbox's), with a layer cache keyed by each step's
// inputs; then the root is flattened, the agent installed, and the template
// booted, its start command run until its ready check passes, and
// checkpointed: the warm image sandboxes are restored from.
//
// The sandboxes come from a Runner (the manager implements it); the
// package knows nothing of HTTP routes or records.
package build

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Spec is what a build makes, as E2B's TemplateBuildStartV2 states it.
type Spec struct {
	FromImage    string    `json:"fromImage,omitempty"`
	FromTemplate string    `json:"fromTemplate,omitempty"`
	Registry     *Registry `json:"fromImageRegistry,omitempty"`
	// FromImageFile (ours) is the files hash of an uploaded image archive
	// (`cellfork template import`).
	FromImageFile string `json:"fromImageFile,omitempty"`
	Force         bool   `json:"force,omitempty"`
	Steps         []Step `json:"steps"`
	StartCmd      string `json:"startCmd,omitempty"`
	ReadyCmd      string `json:"readyCmd,omitempty"`
	// Dockerfile (ours) is converted into the base, steps and start
	// command before the build (internal/templates/dockerfile), its COPY
	// sources taken from the uploaded build context DockerfileContext (a
	// files hash), its ARGs set from BuildArgs.
	Dockerfile        string            `json:"dockerfile,omitempty"`
	DockerfileContext string            `json:"dockerfileContext,omitempty"`
	BuildArgs         map[string]string `json:"buildArgs,omitempty"`
}

// Registry holds the credentials for FromImage, as E2B's FromImageRegistry.
type Registry struct {
	Type     string `json:"type"` // "registry", "aws" or "gcp"
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// GCP: a service account's JSON key, sent as Google's registries take
	// it (user _json_key).
	ServiceAccountJSON string `json:"serviceAccountJson,omitempty"`
	AWSAccessKeyID     string `json:"awsAccessKeyId,omitempty"`
	AWSSecretAccessKey string `json:"awsSecretAccessKey,omitempty"`
	AWSRegion          string `json:"awsRegion,omitempty"`
}

// Step is one instruction, as E2B's TemplateStep.
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
	// Digest (ours) identifies a COPY's files inside a larger upload (a
	// Dockerfile's build context): the cache key uses it, not the
	// upload's hash, so a change elsewhere in the context keeps the cache.
	Digest string `json:"digest,omitempty"`
}

// Step types.
const (
	StepRun     = "RUN"
	StepCopy    = "COPY"
	StepEnv     = "ENV"
	StepWorkdir = "WORKDIR"
	StepUser    = "USER"
)

// Limits on a spec, so that a request cannot bloat the records.
const (
	MaxSteps   = 100
	maxArgs    = 256
	maxArgLen  = 64 << 10
	maxCmdLen  = 64 << 10
	maxRefLen  = 512
	baseImage  = "e2bdev/base" // the SDKs' from_base_image()
	hashLength = 64
)

// BaseImages are the image names the SDKs use for E2B's base image
// (Template().from_base_image()): they build on the built-in template's
// root file system instead of pulling.
var BaseImages = []string{baseImage, baseImage + ":latest", "docker.io/" + baseImage, "docker.io/" + baseImage + ":latest"}

func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, format, args...)
}

// Validate checks the spec's shape (not whether its image or files exist:
// the build reports those).
func (s *Spec) Validate() error {
	if s.Dockerfile != "" {
		return invalid("a Dockerfile must be converted before the build (dockerfile.Apply)")
	}
	n := 0
	for _, f := range []string{s.FromImage, s.FromTemplate, s.FromImageFile} {
		if f != "" {
			n++
		}
	}
	switch {
	case n == 0:
		return invalid("a build needs fromImage, fromTemplate or fromImageFile")
	case n > 1:
		return invalid("fromImage, fromTemplate and fromImageFile are mutually exclusive")
	case len(s.FromImage) > maxRefLen || len(s.FromTemplate) > maxRefLen:
		return invalid("fromImage and fromTemplate must be at most %d bytes", maxRefLen)
	case s.FromImageFile != "" && !validHash(s.FromImageFile):
		return invalid("fromImageFile must be a files hash (64 hex digits)")
	case len(s.Steps) > MaxSteps:
		return invalid("a template has at most %d steps, not %d", MaxSteps, len(s.Steps))
	case len(s.StartCmd) > maxCmdLen || len(s.ReadyCmd) > maxCmdLen:
		return invalid("startCmd and readyCmd must be at most %d bytes", maxCmdLen)
	case strings.ContainsRune(s.StartCmd, 0) || strings.ContainsRune(s.ReadyCmd, 0):
		return invalid("startCmd and readyCmd must not contain NUL bytes")
	}
	if r := s.Registry; r != nil {
		switch r.Type {
		case "registry":
			if r.Username == "" || r.Password == "" {
				return invalid("fromImageRegistry of type registry needs username and password")
			}
		case "gcp":
			if r.ServiceAccountJSON == "" {
				return invalid("fromImageRegistry of type gcp needs serviceAccountJson")
			}
		case "aws":
			return invalid("fromImageRegistry of type aws is not supported: give the ECR credentials as type registry (user AWS, password from `aws ecr get-login-password`)")
		default:
			return invalid("fromImageRegistry.type must be registry, gcp or aws, not %q", r.Type)
		}
		if s.FromImage == "" {
			return invalid("fromImageRegistry needs fromImage")
		}
	}
	for i, st := range s.Steps {
		if err := st.validate(); err != nil {
			return errdefs.New(errdefs.ErrInvalidArgument, "step %d (%s): %s", i+1, st.Type, errdefs.UserMessage(err))
		}
	}
	return nil
}

func validHash(h string) bool {
	if len(h) != hashLength {
		return false
	}
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func (st Step) validate() error {
	if len(st.Args) > maxArgs {
		return invalid("at most %d arguments", maxArgs)
	}
	for _, a := range st.Args {
		if len(a) > maxArgLen || strings.ContainsRune(a, 0) {
			return invalid("arguments must be at most %d bytes, without NUL bytes", maxArgLen)
		}
	}
	switch strings.ToUpper(st.Type) {
	case StepRun:
		if len(st.Args) < 1 || strings.TrimSpace(st.Args[0]) == "" {
			return invalid("RUN needs a command")
		}
	case StepCopy:
		if len(st.Args) < 2 || st.Args[0] == "" || st.Args[1] == "" {
			return invalid("COPY needs a source and a destination")
		}
		if !validHash(st.FilesHash) {
			return invalid("COPY needs filesHash (64 hex digits) naming uploaded files")
		}
		if path.IsAbs(st.Args[0]) || slices.Contains(strings.Split(path.Clean(st.Args[0]), "/"), "..") {
			return invalid("COPY source %q must be relative to the build context, inside it", st.Args[0])
		}
		if len(st.Args) >= 4 && st.Args[3] != "" && !validMode(st.Args[3]) {
			return invalid("COPY mode %q must be octal, like 0755", st.Args[3])
		}
		if len(st.Args) >= 3 && !validOwner(st.Args[2]) {
			return invalid("COPY owner %q must be user or user:group", st.Args[2])
		}
	case StepEnv:
		if len(st.Args) == 0 || len(st.Args)%2 != 0 {
			return invalid("ENV needs name and value pairs")
		}
		for i := 0; i < len(st.Args); i += 2 {
			if st.Args[i] == "" || strings.ContainsRune(st.Args[i], '=') {
				return invalid("ENV name %q must not be empty or contain '='", st.Args[i])
			}
		}
	case StepWorkdir:
		if len(st.Args) < 1 || st.Args[0] == "" {
			return invalid("WORKDIR needs a path")
		}
	case StepUser:
		if len(st.Args) < 1 || !validUser(st.Args[0]) {
			return invalid("USER needs a user name (letters, digits, '.', '_', '-')")
		}
	default:
		return invalid("unknown step type %q (RUN, COPY, ENV, WORKDIR, USER)", st.Type)
	}
	return nil
}

func validMode(m string) bool {
	if len(m) == 0 || len(m) > 5 {
		return false
	}
	for _, c := range m {
		if c < '0' || c > '7' {
			return false
		}
	}
	return true
}

// validUser: a name that is safe in a shell word without quoting.
func validUser(u string) bool {
	if u == "" || len(u) > 64 || u[0] == '-' {
		return false
	}
	for _, c := range u {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func validOwner(o string) bool {
	if o == "" {
		return true
	}
	u, g, hasGroup := strings.Cut(o, ":")
	return validUser(u) && (!hasGroup || validUser(g))
}

// Context is what steps hand on to the next: the user and working
// directory commands run as and in, and the environment (E2B's build
// metadata context). The final context is the sandboxes' defaults.
type Context struct {
	User    string            `json:"user"`
	Workdir string            `json:"workdir,omitempty"` // "": the user's home
	Env     map[string]string `json:"env,omitempty"`
}

func (c Context) clone() Context {
	c.Env = maps.Clone(c.Env)
	if c.Env == nil {
		c.Env = map[string]string{}
	}
	return c
}

// canonical is the context as part of a cache key.
func (c Context) canonical() string {
	keys := slices.Sorted(maps.Keys(c.Env))
	var b strings.Builder
	fmt.Fprintf(&b, "user=%q workdir=%q", c.User, c.Workdir)
	for _, k := range keys {
		fmt.Fprintf(&b, " %q=%q", k, c.Env[k])
	}
	return b.String()
}

// canonical is the step as part of a cache key (force is not: it only
// decides whether the cache is read).
func (st Step) canonical() string {
	files := st.FilesHash
	if st.Digest != "" {
		files = "digest:" + st.Digest
	}
	b, _ := json.Marshal(struct {
		Type  string   `json:"type"`
		Args  []string `json:"args"`
		Files string   `json:"files,omitempty"`
	}{strings.ToUpper(st.Type), st.Args, files})
	return string(b)
}

// String describes the step for logs: "RUN apt-get update".
func (st Step) String() string {
	t := strings.ToUpper(st.Type)
	switch t {
	case StepEnv:
		var kv []string
		for i := 0; i+1 < len(st.Args); i += 2 {
			kv = append(kv, st.Args[i]+"="+st.Args[i+1])
		}
		return t + " " + strings.Join(kv, " ")
	case StepCopy:
		if len(st.Args) >= 2 {
			return t + " " + st.Args[0] + " " + st.Args[1]
		}
	}
	return strings.TrimSpace(t + " " + strings.Join(st.Args, " "))
}
