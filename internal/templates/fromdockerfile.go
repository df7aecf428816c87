package templates

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/templates/build"
	"github.com/cellfork/cellfork/internal/templates/dockerfile"
)

// applyDockerfile turns a spec that carries a Dockerfile into a plain one:
// the Dockerfile's FROM, then its steps, then the spec's own; its start
// and ready commands unless the spec sets them. Each COPY takes its files
// from the build context upload, with a digest of just those files for the
// cache. It returns the Dockerfile's warnings.
func (s *Service) applyDockerfile(sp *build.Spec) ([]string, error) {
	if sp.Dockerfile == "" {
		return nil, nil
	}
	if sp.FromImage != "" || sp.FromTemplate != "" || sp.FromImageFile != "" {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "dockerfile names its base (FROM): leave fromImage, fromTemplate and fromImageFile out")
	}
	df, err := dockerfile.Parse(sp.Dockerfile, sp.BuildArgs)
	if err != nil {
		return nil, err
	}
	var digests map[string]string
	var steps []build.Step
	for _, st := range df.Steps {
		bs := build.Step{Type: st.Type, Args: st.Args}
		if st.Type == build.StepCopy {
			if sp.DockerfileContext == "" {
				return nil, errdefs.New(errdefs.ErrInvalidArgument, "the Dockerfile copies %s: upload the build context and name it in dockerfileContext", st.Args[0])
			}
			if digests == nil {
				p, ok := s.FilePath(sp.DockerfileContext)
				if !ok {
					return nil, errdefs.New(errdefs.ErrNotFound, "the build context %s was not uploaded", sp.DockerfileContext)
				}
				if digests, err = contextDigests(p); err != nil {
					return nil, err
				}
			}
			bs.FilesHash = sp.DockerfileContext
			bs.Digest = digestOf(digests, st.Args[0])
			if bs.Digest == "" {
				return nil, errdefs.New(errdefs.ErrInvalidArgument, "COPY %s: no such file in the build context", st.Args[0])
			}
		}
		steps = append(steps, bs)
	}
	sp.FromImage = df.FromImage
	sp.Steps = append(steps, sp.Steps...)
	if sp.StartCmd == "" {
		sp.StartCmd = df.StartCmd
	}
	if sp.ReadyCmd == "" {
		sp.ReadyCmd = df.ReadyCmd
	}
	sp.Dockerfile, sp.BuildArgs = "", nil
	return df.Warnings, nil
}

// contextDigests hashes each entry of a build context tar (gzipped or
// not): name -> digest of its type, mode, link and content.
func contextDigests(p string) (map[string]string, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = bufio.NewReader(f)
	if magic, _ := r.(*bufio.Reader).Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(r)
		if err != nil {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "the build context is not a tar: %v", err)
		}
		r = gz
	}
	out := map[string]string{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "the build context is not a tar: %v", err)
		}
		d := sha256.New()
		fmt.Fprintf(d, "%c %o %s\x00", h.Typeflag, h.Mode&0o7777, h.Linkname)
		if _, err := io.Copy(d, tr); err != nil {
			return nil, err
		}
		out[strings.TrimPrefix(path.Clean("/"+h.Name), "/")] = hex.EncodeToString(d.Sum(nil))
	}
}

// digestOf combines the digests of the context entries a COPY source
// covers (the source, or what lies under it; glob patterns matched as
// Docker matches them); "" when it covers none.
func digestOf(entries map[string]string, src string) string {
	src = strings.TrimPrefix(path.Clean("/"+src), "/")
	var names []string
	for name := range entries {
		if src == "" || name == src || strings.HasPrefix(name, src+"/") {
			names = append(names, name)
			continue
		}
		// A glob covers the entries it matches and everything under them.
		for p := name; p != "." && p != ""; p = path.Dir(p) {
			if ok, _ := path.Match(src, p); ok {
				names = append(names, name)
				break
			}
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s\x00%s\x00", n, entries[n])
	}
	return hex.EncodeToString(h.Sum(nil))
}
