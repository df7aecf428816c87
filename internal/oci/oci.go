// Package oci gets container images for template builds: it pulls them from
// registries (Docker Hub by default, any registry with credentials, through
// go-containerregistry) or reads them from a local archive (`docker save` or
// an OCI archive), and unpacks an image's flattened file system into a
// directory without letting the archive write outside it (unpack.go).
package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Auth is a registry's basic credentials (empty: anonymous).
type Auth struct {
	Username string
	Password string
}

// Config is what a template build takes from an image's configuration.
type Config struct {
	Env        []string // KEY=VALUE
	WorkingDir string
	User       string
	Entrypoint []string
	Cmd        []string
}

// Puller pulls images from registries. Safe for concurrent use.
type Puller struct {
	// Mirrors maps a registry host to the host to pull its images from
	// instead ("index.docker.io" is Docker Hub). Nothing else is rewritten.
	Mirrors map[string]string
	// Timeout bounds resolving a reference (the manifest); layers are read
	// while unpacking, under the caller's context.
	Timeout time.Duration
}

// dockerHub is go-containerregistry's name for Docker Hub.
const dockerHub = name.DefaultRegistry

// ParseRef parses an image reference ("ubuntu:22.04",
// "registry:5000/team/app@sha256:...") into the reference to pull,
// applying the puller's mirrors.
func (p *Puller) ParseRef(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid image reference %q: %v", ref, err)
	}
	reg := r.Context().RegistryStr()
	mirror, ok := p.Mirrors[reg]
	if !ok && (reg == "docker.io" || reg == "registry-1.docker.io") {
		mirror, ok = p.Mirrors[dockerHub]
	}
	if !ok {
		return r, nil
	}
	repo := mirror + "/" + r.Context().RepositoryStr()
	switch v := r.(type) {
	case name.Digest:
		return name.NewDigest(repo + "@" + v.DigestStr())
	case name.Tag:
		return name.NewTag(repo + ":" + v.TagStr())
	}
	return r, nil
}

// Pull resolves ref to an image for this machine's platform. Its layers
// are fetched lazily (by Unpack). Registry failures come back as
// ErrNotFound (no such image), ErrUnauthenticated (credentials refused) or
// ErrUnavailable (the registry cannot be reached), with a message for the
// caller.
func (p *Puller) Pull(ctx context.Context, ref string, auth Auth) (v1.Image, error) {
	r, err := p.ParseRef(ref)
	if err != nil {
		return nil, err
	}
	var a authn.Authenticator = authn.Anonymous
	if auth.Username != "" || auth.Password != "" {
		a = &authn.Basic{Username: auth.Username, Password: auth.Password}
	}
	timeout := p.Timeout
	if timeout == 0 {
		timeout = time.Minute
	}
	// ctx also governs the layers, read later while unpacking; the
	// timeout bounds each connection and each wait for an answer.
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: timeout}).DialContext
	tr.ResponseHeaderTimeout = timeout
	desc, err := remote.Get(r, remote.WithContext(ctx), remote.WithAuth(a), remote.WithTransport(tr),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		return nil, registryError(ref, r, err)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, registryError(ref, r, err)
	}
	return img, nil
}

// registryError turns a registry failure into an error class with a
// message naming the image and the registry.
func registryError(ref string, r name.Reference, err error) error {
	reg := r.Context().RegistryStr()
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound:
			return errdefs.New(errdefs.ErrNotFound, "image %q not found in registry %s", ref, reg)
		case http.StatusUnauthorized, http.StatusForbidden:
			return errdefs.New(errdefs.ErrUnauthenticated, "registry %s refused access to image %q (check the credentials): %v", reg, ref, te)
		}
		for _, d := range te.Errors {
			if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode {
				return errdefs.New(errdefs.ErrNotFound, "image %q not found in registry %s", ref, reg)
			}
		}
		return errdefs.New(errdefs.ErrUnavailable, "registry %s answered %d for image %q: %v", reg, te.StatusCode, ref, te)
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) {
		return errdefs.New(errdefs.ErrUnavailable, "registry %s is unreachable (pulling %q): %v", reg, ref, err)
	}
	// go-containerregistry has no error value for this one
	// (remote/index.go: fmt.Errorf("no child with platform ...")).
	if strings.Contains(err.Error(), "no child with platform") {
		return errdefs.New(errdefs.ErrInvalidArgument, "image %q has no variant for linux/%s", ref, runtime.GOARCH)
	}
	return errdefs.New(errdefs.ErrUnavailable, "pulling image %q from %s: %v", ref, reg, err)
}

// Load reads the image in a local archive: a `docker save` tarball
// (manifest.json) or an OCI image layout, as a tar (`oci-archive`) or a
// directory. An archive with several images must hold exactly one.
func Load(path string) (v1.Image, func(), error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, nil, errdefs.New(errdefs.ErrInvalidArgument, "reading image archive: %v", err)
	}
	if fi.IsDir() {
		img, err := fromLayout(path)
		return img, func() {}, err
	}
	names, err := tarNames(path)
	if err != nil {
		return nil, nil, errdefs.New(errdefs.ErrInvalidArgument, "image archive is not a tar file: %v", err)
	}
	switch {
	case names["manifest.json"]:
		img, err := tarball.ImageFromPath(path, nil)
		if err != nil {
			return nil, nil, errdefs.New(errdefs.ErrInvalidArgument, "reading docker image archive: %v", err)
		}
		return img, func() {}, nil
	case names["index.json"] && names["oci-layout"]:
		dir, err := os.MkdirTemp(filepath.Dir(path), ".oci-layout-")
		if err != nil {
			return nil, nil, err
		}
		cleanup := func() { os.RemoveAll(dir) }
		if err := unpackLayout(path, dir); err != nil {
			cleanup()
			return nil, nil, err
		}
		img, err := fromLayout(dir)
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		return img, cleanup, nil
	}
	return nil, nil, errdefs.New(errdefs.ErrInvalidArgument, "image archive has neither manifest.json (docker save) nor index.json and oci-layout (OCI archive)")
}

// tarNames lists the top-level names of a tar file.
func tarNames(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out[strings.TrimPrefix(filepath.Clean(h.Name), "./")] = true
	}
}

// unpackLayout extracts an OCI archive (regular files and directories
// only: a layout has nothing else) into dir.
func unpackLayout(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return errdefs.New(errdefs.ErrInvalidArgument, "reading OCI archive: %v", err)
		}
		rel, ok := cleanRel(h.Name)
		if !ok {
			return errdefs.New(errdefs.ErrInvalidArgument, "OCI archive entry %q escapes the archive", h.Name)
		}
		if rel == "." {
			continue
		}
		p := filepath.Join(dir, rel)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				return err
			}
			out, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return errdefs.New(errdefs.ErrInvalidArgument, "OCI archive entry %q is not a file or directory", h.Name)
		}
	}
}

func fromLayout(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "reading OCI image layout: %v", err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "reading OCI image index: %v", err)
	}
	if len(m.Manifests) != 1 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "OCI archive holds %d images; import one at a time", len(m.Manifests))
	}
	d := m.Manifests[0]
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "reading OCI image index: %v", err)
		}
		cm, err := child.IndexManifest()
		if err != nil {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "reading OCI image index: %v", err)
		}
		for _, c := range cm.Manifests {
			if c.Platform == nil || c.Platform.OS == "linux" && c.Platform.Architecture == runtime.GOARCH {
				return child.Image(c.Digest)
			}
		}
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "OCI archive has no image for linux/%s", runtime.GOARCH)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "reading OCI image: %v", err)
	}
	return img, nil
}

// ImageConfig returns what a build takes from img's configuration.
func ImageConfig(img v1.Image) (Config, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return Config{}, fmt.Errorf("reading image config: %w", err)
	}
	c := cf.Config
	return Config{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}, nil
}

// Digest returns the image's manifest digest ("sha256:...").
func Digest(img v1.Image) (string, error) {
	h, err := img.Digest()
	if err != nil {
		return "", err
	}
	return h.String(), nil
}
