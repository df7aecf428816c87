package cli

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// template builds, lists, deletes and imports custom templates through the
// daemon's template API (E2B's, as the SDKs' Template.build() calls it).
func (a *app) template(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return &usageError{msg: "missing template subcommand", usage: usageTemplate}
	}
	switch args[0] {
	case "build":
		return a.templateBuild(ctx, args[1:])
	case "import":
		return a.templateImport(ctx, args[1:])
	case "list", "ls":
		return a.templateList(ctx, args[1:])
	case "delete", "rm":
		return a.templateDelete(ctx, args[1:])
	case "-h", "--help", "help":
		return &helpRequest{usage: usageTemplate}
	}
	return &usageError{msg: fmt.Sprintf("unknown template subcommand %q", args[0]), usage: usageTemplate}
}

// stepsFile is `cellfork template build --steps FILE`: the template as E2B's
// build API takes it (Template.to_json() writes one), COPY steps' files
// hashes optional (the build context is uploaded for them).
type stepsFile struct {
	FromImage    string            `json:"fromImage,omitempty"`
	FromTemplate string            `json:"fromTemplate,omitempty"`
	Steps        []json.RawMessage `json:"steps"`
	StartCmd     string            `json:"startCmd,omitempty"`
	ReadyCmd     string            `json:"readyCmd,omitempty"`
}

// buildOpts are the flags template build and import share.
type buildOpts struct {
	name     string
	cpus     int
	memoryMB int
	start    string
	ready    string
	noCache  bool
	tags     multiFlag
}

func (o *buildOpts) register(fs *flag.FlagSet) {
	fs.StringVar(&o.name, "name", "", "")
	fs.IntVar(&o.cpus, "cpus", 0, "")
	fs.IntVar(&o.memoryMB, "memory-mb", 0, "")
	fs.StringVar(&o.start, "start-cmd", "", "")
	fs.StringVar(&o.ready, "ready-cmd", "", "")
	fs.BoolVar(&o.noCache, "no-cache", false, "")
	fs.Var(&o.tags, "tag", "")
}

// multiFlag collects a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func (a *app) templateBuild(ctx context.Context, args []string) error {
	fset := a.flagSet("template build")
	var o buildOpts
	o.register(fset)
	dockerfile := fset.String("f", "", "")
	fset.StringVar(dockerfile, "file", "", "")
	steps := fset.String("steps", "", "")
	fromImage := fset.String("from-image", "", "")
	fromTemplate := fset.String("from-template", "", "")
	var buildArgs kvFlag
	fset.Var(&buildArgs, "build-arg", "")
	rest, err := parseArgs(fset, args, 0)
	if err != nil {
		return flagError(err, usageTemplateBuild)
	}
	if o.name == "" {
		return &usageError{msg: "--name is required", usage: usageTemplateBuild}
	}
	if len(rest) > 1 {
		return &usageError{msg: "at most one build context directory", usage: usageTemplateBuild}
	}
	sources := 0
	for _, s := range []string{*dockerfile, *steps, *fromImage, *fromTemplate} {
		if s != "" {
			sources++
		}
	}
	if sources != 1 {
		return &usageError{msg: "give one of -f DOCKERFILE, --steps FILE, --from-image IMAGE and --from-template NAME", usage: usageTemplateBuild}
	}
	ctxDir := "."
	if len(rest) == 1 {
		ctxDir = rest[0]
	}
	spec := map[string]any{"force": o.noCache}
	needContext := false
	switch {
	case *dockerfile != "":
		b, err := os.ReadFile(*dockerfile)
		if err != nil {
			return fmt.Errorf("reading the Dockerfile: %w", err)
		}
		spec["dockerfile"] = string(b)
		spec["buildArgs"] = orEmpty(buildArgs.m)
		needContext = dockerfileCopies(string(b))
	case *steps != "":
		b, err := os.ReadFile(*steps)
		if err != nil {
			return fmt.Errorf("reading the steps file: %w", err)
		}
		var sf stepsFile
		if err := json.Unmarshal(b, &sf); err != nil {
			return fmt.Errorf("the steps file is not valid JSON: %w", err)
		}
		var list []map[string]any
		for _, raw := range sf.Steps {
			var st map[string]any
			if err := json.Unmarshal(raw, &st); err != nil {
				return fmt.Errorf("the steps file has a step that is not an object: %s", raw)
			}
			if t, _ := st["type"].(string); strings.EqualFold(t, "COPY") && st["filesHash"] == nil {
				needContext = true
			}
			list = append(list, st)
		}
		spec["steps"], spec["fromImage"], spec["fromTemplate"] = list, sf.FromImage, sf.FromTemplate
		if sf.StartCmd != "" {
			spec["startCmd"] = sf.StartCmd
		}
		if sf.ReadyCmd != "" {
			spec["readyCmd"] = sf.ReadyCmd
		}
	case *fromImage != "":
		spec["fromImage"] = *fromImage
	default:
		spec["fromTemplate"] = *fromTemplate
	}
	if o.start != "" {
		spec["startCmd"] = o.start
	}
	if o.ready != "" {
		spec["readyCmd"] = o.ready
	}
	return a.runBuild(ctx, o, spec, func(c *apiClient, templateID string) error {
		if !needContext {
			return nil
		}
		fmt.Fprintf(a.stderr, "packing the build context %s\n", ctxDir)
		tarPath, hash, err := packContext(ctxDir)
		if err != nil {
			return err
		}
		defer os.Remove(tarPath)
		if err := a.uploadFile(ctx, c, templateID, tarPath, hash); err != nil {
			return err
		}
		if _, ok := spec["dockerfile"]; ok {
			spec["dockerfileContext"] = hash
		} else {
			for _, st := range spec["steps"].([]map[string]any) {
				if t, _ := st["type"].(string); strings.EqualFold(t, "COPY") && st["filesHash"] == nil {
					st["filesHash"] = hash
				}
			}
		}
		return nil
	})
}

// dockerfileCopies: does the Dockerfile have COPY or ADD (so it needs the
// build context)? A rough look; the daemon parses it.
func dockerfileCopies(df string) bool {
	for _, l := range strings.Split(df, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && (strings.EqualFold(f[0], "COPY") || strings.EqualFold(f[0], "ADD")) {
			return true
		}
	}
	return false
}

func (a *app) templateImport(ctx context.Context, args []string) error {
	fset := a.flagSet("template import")
	var o buildOpts
	o.register(fset)
	rest, err := parseArgs(fset, args, 0)
	if err != nil {
		return flagError(err, usageTemplateImport)
	}
	if len(rest) != 1 || o.name == "" {
		return &usageError{msg: "want one image archive and --name", usage: usageTemplateImport}
	}
	hash, err := fileHash(rest[0])
	if err != nil {
		return err
	}
	spec := map[string]any{"fromImageFile": hash, "force": o.noCache}
	if o.start != "" {
		spec["startCmd"] = o.start
	}
	if o.ready != "" {
		spec["readyCmd"] = o.ready
	}
	return a.runBuild(ctx, o, spec, func(c *apiClient, templateID string) error {
		return a.uploadFile(ctx, c, templateID, rest[0], hash)
	})
}

// runBuild requests a build, lets prepare upload what it needs, starts it
// and follows its log until it ends.
func (a *app) runBuild(ctx context.Context, o buildOpts, spec map[string]any, prepare func(*apiClient, string) error) error {
	c, err := a.client()
	if err != nil {
		return err
	}
	t0 := time.Now()
	req := map[string]any{"name": o.name}
	if len(o.tags) > 0 {
		req["tags"] = []string(o.tags)
	}
	if o.cpus > 0 {
		req["cpuCount"] = o.cpus
	}
	if o.memoryMB > 0 {
		req["memoryMB"] = o.memoryMB
	}
	var created struct {
		TemplateID string   `json:"templateID"`
		BuildID    string   `json:"buildID"`
		Tags       []string `json:"tags"`
	}
	if _, err := c.do(ctx, "POST", "/v3/templates", nil, req, &created); err != nil {
		return err
	}
	if err := prepare(c, created.TemplateID); err != nil {
		return err
	}
	base := "/templates/" + url.PathEscape(created.TemplateID) + "/builds/" + url.PathEscape(created.BuildID)
	if _, err := c.do(ctx, "POST", "/v2/templates/"+url.PathEscape(created.TemplateID)+"/builds/"+url.PathEscape(created.BuildID), nil, spec, nil); err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "building template %s (id %s, build %s)\n", o.name, created.TemplateID, created.BuildID)
	offset := 0
	for {
		var st struct {
			Status     string `json:"status"`
			LogEntries []struct {
				Level   string `json:"level"`
				Message string `json:"message"`
				Step    string `json:"step"`
			} `json:"logEntries"`
			Reason *struct {
				Message string `json:"message"`
				Step    string `json:"step"`
			} `json:"reason"`
		}
		q := url.Values{"logsOffset": {fmt.Sprint(offset)}, "level": {"info"}}
		if _, err := c.do(ctx, "GET", base+"/status", q, nil, &st); err != nil {
			return err
		}
		for _, e := range st.LogEntries {
			fmt.Fprintf(a.stderr, "%6.1fs %s\n", time.Since(t0).Seconds(), e.Message)
		}
		offset += len(st.LogEntries)
		if len(st.LogEntries) == 0 {
			switch st.Status {
			case "ready":
				if a.g.json {
					raw, _ := json.Marshal(map[string]any{"templateID": created.TemplateID, "buildID": created.BuildID,
						"name": o.name, "tags": created.Tags, "seconds": time.Since(t0).Seconds()})
					return a.printJSON(raw)
				}
				fmt.Fprintln(a.stdout, created.TemplateID)
				fmt.Fprintf(a.stderr, "template %s is ready (%.1fs): cellfork sandbox create --template %s\n", o.name, time.Since(t0).Seconds(), o.name)
				return nil
			case "error":
				msg, step := "the build failed", ""
				if st.Reason != nil {
					msg, step = st.Reason.Message, st.Reason.Step
				}
				if step != "" {
					msg = fmt.Sprintf("step %s: %s", step, msg)
				}
				return fmt.Errorf("build of %s failed: %s", o.name, msg)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// uploadFile sends a file by its hash through the daemon's upload link
// (skipped when the daemon has it already).
func (a *app) uploadFile(ctx context.Context, c *apiClient, templateID, file, hash string) error {
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	if _, err := c.do(ctx, "GET", "/templates/"+url.PathEscape(templateID)+"/files/"+hash, nil, nil, &link); err != nil {
		return err
	}
	if link.Present {
		fmt.Fprintf(a.stderr, "%s: already uploaded\n", filepath.Base(file))
		return nil
	}
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	// The link names the host the daemon was asked by; send it to the
	// daemon we talk to, whatever address it printed.
	u, err := url.Parse(link.URL)
	if err != nil {
		return fmt.Errorf("the daemon's upload link %q: %w", link.URL, err)
	}
	req, err := http.NewRequestWithContext(ctx, "PUT", c.Base+u.RequestURI(), f)
	if err != nil {
		return err
	}
	req.ContentLength = fi.Size()
	req.Header.Set("Content-Type", "application/octet-stream")
	fmt.Fprintf(a.stderr, "uploading %s (%d KiB)\n", filepath.Base(file), fi.Size()>>10)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return reachError(c.Base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errorFromResponse(resp)
	}
	return nil
}

// orEmpty returns m, or an empty non-nil map (which encodes as {}).
func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// fileHash is a file's SHA-256.
func fileHash(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, bufio.NewReader(f)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// packContext writes a gzipped tar of dir (minus what .dockerignore
// excludes) to a temporary file, entries sorted and times zeroed so that
// the same files give the same hash.
func packContext(dir string) (string, string, error) {
	ignore, err := readIgnore(filepath.Join(dir, ".dockerignore"))
	if err != nil {
		return "", "", err
	}
	var paths []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if ignored(ignore, rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		paths = append(paths, rel)
		return nil
	})
	if err != nil {
		return "", "", fmt.Errorf("reading the build context: %w", err)
	}
	sort.Strings(paths)
	out, err := os.CreateTemp("", "cellfork-context-*.tar.gz")
	if err != nil {
		return "", "", err
	}
	h := sha256.New()
	gz := gzip.NewWriter(io.MultiWriter(out, h))
	tw := tar.NewWriter(gz)
	for _, rel := range paths {
		if err := addToTar(tw, filepath.Join(dir, rel), rel); err != nil {
			out.Close()
			os.Remove(out.Name())
			return "", "", err
		}
	}
	if err := tw.Close(); err == nil {
		err = gz.Close()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out.Name())
		return "", "", err
	}
	return out.Name(), hex.EncodeToString(h.Sum(nil)), nil
}

func addToTar(tw *tar.Writer, p, rel string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	link := ""
	if fi.Mode()&os.ModeSymlink != 0 {
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	}
	h, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return nil // sockets and the like: not part of a context
	}
	h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname = rel, time.Time{}, 0, 0, "", ""
	h.AccessTime, h.ChangeTime, h.Format = time.Time{}, time.Time{}, tar.FormatPAX
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(tw, f)
	return err
}

// readIgnore reads .dockerignore: one pattern a line, # comments, !
// exceptions.
func readIgnore(p string) ([]string, error) {
	b, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, strings.TrimPrefix(path.Clean("/"+strings.TrimPrefix(l, "!")), "/"))
			if strings.HasPrefix(l, "!") {
				out[len(out)-1] = "!" + out[len(out)-1]
			}
		}
	}
	return out, nil
}

// ignored applies .dockerignore's patterns in order (the last that matches
// wins); a pattern matching a directory excludes what it holds.
func ignored(patterns []string, rel string) bool {
	out := false
	for _, p := range patterns {
		neg := strings.HasPrefix(p, "!")
		p = strings.TrimPrefix(p, "!")
		for q := rel; q != "." && q != ""; q = path.Dir(q) {
			if ok, _ := path.Match(p, q); ok {
				out = !neg
				break
			}
		}
	}
	return out
}

func (a *app) templateList(ctx context.Context, args []string) error {
	fset := a.flagSet("template list")
	if _, err := parseArgs(fset, args, 0); err != nil {
		return flagError(err, usageTemplateList)
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	var list []map[string]any
	if _, err := c.do(ctx, "GET", "/v2/templates", nil, nil, &list); err != nil {
		return err
	}
	if a.g.json {
		raw, _ := json.Marshal(list)
		return a.printJSON(raw)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tSTATUS\tBUILDS\tCPUS\tMEMORY\tSANDBOXES")
	for _, t := range list {
		names, _ := t["names"].([]any)
		var ns []string
		for _, n := range names {
			ns = append(ns, fmt.Sprint(n))
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t%v\t%v\t%v MiB\t%v\n", strings.Join(ns, ","), t["templateID"], t["buildStatus"],
			t["buildCount"], t["cpuCount"], t["memoryMB"], t["spawnCount"])
	}
	return tw.Flush()
}

func (a *app) templateDelete(ctx context.Context, args []string) error {
	fset := a.flagSet("template delete")
	rest, err := parseArgs(fset, args, 0)
	if err != nil {
		return flagError(err, usageTemplateDelete)
	}
	if len(rest) == 0 {
		return &usageError{msg: "missing template name or id", usage: usageTemplateDelete}
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	failed := false
	for _, id := range rest {
		if _, err := c.do(ctx, "DELETE", "/templates/"+url.PathEscape(id), nil, nil, nil); err != nil {
			fmt.Fprintf(a.stderr, "cellfork: %s: %v\n", id, err)
			failed = true
			continue
		}
		fmt.Fprintln(a.stdout, id)
	}
	if failed {
		return &exitError{code: 1}
	}
	return nil
}
