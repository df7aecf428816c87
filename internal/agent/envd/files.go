package envd

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellfork/cellfork/internal/agent"
)

// uploadIdle bounds how long an upload may send nothing before it fails,
// like upstream envd's per-read idle timeout.
const uploadIdle = 60 * time.Second

// filesHandler serves GET and POST /files. Safe for concurrent use.
type filesHandler struct {
	settings  *agent.Settings
	maxUpload int64 // bytes per request, compressed and inflated
}

// writtenFile is one element of the POST /files response.
type writtenFile struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func (h *filesHandler) download(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	acc, err := lookupAccount(h.settings, q.Get("username"))
	if err != nil {
		writeError(w, "download", err)
		return
	}
	path, err := resolvePath(q.Get("path"), acc, h.settings.Workdir())
	if err != nil {
		writeError(w, "download", err)
		return
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) || classify(err) == kindNotFound {
		writeError(w, "download", notFoundf("file not found: %s", path))
		return
	}
	if err != nil {
		writeError(w, "download", fmt.Errorf("opening %s: %w", path, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, "download", fmt.Errorf("stating %s: %w", path, err))
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, "download", invalidf("path is not a file: %s", path))
		return
	}
	name := filepath.Base(path)
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": name}))
	if fi.Size() == 0 || onPseudoFS(f) {
		// Empty, or a procfs/sysfs file: those report a size (0, or 4096
		// in sysfs) that is not their content's and may not seek, so
		// ServeContent (ranges, lengths) cannot serve them. Stream
		// whatever reading yields.
		streamFile(w, name, f)
		return
	}
	http.ServeContent(w, r, name, fi.ModTime(), f)
}

// pseudoFSMagics are the filesystems (linux/magic.h) whose files are
// generated on read: procfs, sysfs, cgroup, cgroup2, debugfs, tracefs,
// securityfs, configfs.
var pseudoFSMagics = map[int64]bool{
	0x9fa0: true, 0x62656572: true, 0x27e0eb: true, 0x63677270: true,
	0x64626720: true, 0x74726163: true, 0x73636673: true, 0x62656570: true,
}

func onPseudoFS(f *os.File) bool {
	var st unix.Statfs_t
	return unix.Fstatfs(int(f.Fd()), &st) == nil && pseudoFSMagics[int64(st.Type)]
}

// streamFile copies f to w without a length: for files whose size is not
// known before reading them.
func streamFile(w http.ResponseWriter, name string, f *os.File) {
	ctype := mime.TypeByExtension(filepath.Ext(name))
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(http.StatusOK)
	// Not sendfile(2), which procfs files do not all support.
	if _, err := io.Copy(w, struct{ io.Reader }{f}); err != nil {
		// Headers are out: all that can be done is cut the response short.
		log.Printf("download %s: %v", f.Name(), err)
		panic(http.ErrAbortHandler)
	}
}

func (h *filesHandler) upload(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	acc, err := lookupAccount(h.settings, q.Get("username"))
	if err != nil {
		writeError(w, "upload", err)
		return
	}
	body, err := h.requestBody(w, r)
	if err != nil {
		writeError(w, "upload", err)
		return
	}
	defer body.Close()
	md := uploadMetadata(r.Header)
	if err := validateMetadata(md); err != nil {
		writeError(w, "upload", err)
		return
	}
	resolve := func(p string) (string, error) { return resolvePath(p, acc, h.settings.Workdir()) }
	var written []writtenFile
	store := func(path string, content io.Reader) error {
		if err := writeFile(path, content, acc, md); err != nil {
			return err
		}
		// What was stored, as upstream: a filesystem without user xattrs
		// keeps none.
		written = append(written, writtenFile{Name: filepath.Base(path), Type: "file", Path: path, Metadata: readMetadata(path)})
		return nil
	}
	pathQuery, hasPath := q.Get("path"), q.Has("path")
	if err := readUploads(r.Header.Get("Content-Type"), body, pathQuery, hasPath, resolve, store); err != nil {
		writeError(w, "upload", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(written)
}

// requestBody returns the request body bounded by maxUpload and an idle
// timeout, inflated when it is Content-Encoding: gzip.
func (h *filesHandler) requestBody(w http.ResponseWriter, r *http.Request) (io.ReadCloser, error) {
	rc := http.NewResponseController(w)
	limit := h.maxUpload
	if n := h.settings.MaxUpload(); n > 0 {
		limit = n
	}
	raw := http.MaxBytesReader(w, r.Body, limit)
	body := io.ReadCloser(&idleReader{r: raw, rc: rc})
	return inflate(body, r.Header.Get("Content-Encoding"), limit)
}

// inflate decodes a gzip body (other encodings are refused) and bounds the
// inflated size by limit.
func inflate(body io.ReadCloser, encoding string, limit int64) (io.ReadCloser, error) {
	switch strings.ToLower(strings.TrimSpace(encoding)) {
	case "", "identity":
		return body, nil
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			_ = body.Close()
			return nil, invalidf("decompressing request body: %w", err)
		}
		return &limitedReadCloser{r: zr, limit: limit, closer: body}, nil
	}
	_ = body.Close()
	return nil, invalidf("unsupported Content-Encoding %q", encoding)
}

// uploadMetadata collects X-Metadata-<key> headers; keys are lower-cased.
func uploadMetadata(h http.Header) map[string]string {
	var md map[string]string
	for k, vs := range h {
		key, ok := strings.CutPrefix(strings.ToLower(k), "x-metadata-")
		if !ok || key == "" || len(vs) == 0 {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = vs[0]
	}
	return md
}

// readUploads parses an upload body and calls store for each file in
// order. A multipart body has one `file` part per file, named by the path
// query (one file) or the part's filename; an octet-stream body is one file
// at the path query.
func readUploads(contentType string, body io.Reader, pathQuery string, hasPath bool,
	resolve func(string) (string, error), store func(path string, content io.Reader) error,
) error {
	mediaType, params, err := mime.ParseMediaType(contentType)
	if err != nil && contentType != "" {
		return invalidf("invalid Content-Type %q", contentType)
	}
	switch {
	case mediaType == "application/octet-stream":
		if !hasPath {
			return invalidf("the path query parameter is required for an application/octet-stream upload")
		}
		path, err := resolve(pathQuery)
		if err != nil {
			return err
		}
		return store(path, body)
	case strings.HasPrefix(mediaType, "multipart/"):
		if params["boundary"] == "" {
			return invalidf("multipart Content-Type without a boundary")
		}
		return readMultipart(multipart.NewReader(body, params["boundary"]), pathQuery, hasPath, resolve, store)
	}
	return invalidf("unsupported Content-Type %q: want multipart/form-data or application/octet-stream", contentType)
}

func readMultipart(mr *multipart.Reader, pathQuery string, hasPath bool,
	resolve func(string) (string, error), store func(string, io.Reader) error,
) error {
	seen := map[string]bool{}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return bodyError("reading multipart body", err)
		}
		if part.FormName() != "file" {
			_ = part.Close()
			continue
		}
		name := pathQuery
		if !hasPath {
			name = partFilename(part)
			if name == "" {
				return invalidf("a file part has no filename and there is no path query parameter")
			}
		}
		path, err := resolve(name)
		if err != nil {
			return err
		}
		if seen[path] {
			return invalidf("cannot upload several files to the same path %s in one request", path)
		}
		seen[path] = true
		if err := store(path, part); err != nil {
			return err
		}
	}
	if len(seen) == 0 {
		return invalidf("no file part in the multipart body (want form field \"file\")")
	}
	return nil
}

// partFilename returns the full filename of a part. multipart.Part.FileName
// strips directories, but the SDK sends the target path there; httpx
// escapes `"` as %22 (HTML5 form encoding), which is undone here.
func partFilename(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return strings.ReplaceAll(params["filename"], "%22", `"`)
}

// bodyError classifies a failure to read the request body.
func bodyError(context string, err error) error {
	switch k := classify(err); k {
	case kindTooLarge, kindTimeout, kindInvalid:
		return &classed{kind: k, err: fmt.Errorf("%s: %w", context, err)}
	}
	return invalidf("%s: %w", context, err)
}

// writeFile streams content into path (created or truncated, owned by acc),
// creating missing parent directories owned by acc, and makes md its whole
// metadata (none clears what an earlier upload set). A file created by a
// failed write is removed.
func writeFile(path string, content io.Reader, acc agent.Account, md map[string]string) error {
	if err := ensureDirs(filepath.Dir(path), acc); err != nil {
		return err
	}
	fi, statErr := os.Stat(path)
	if statErr == nil && fi.IsDir() {
		return invalidf("path is a directory: %s", path)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	created := statErr != nil
	fail := func(err error) error {
		_ = f.Close()
		if created {
			_ = os.Remove(path)
		}
		return err
	}
	if err := f.Chown(int(acc.UID), int(acc.GID)); err != nil {
		return fail(fmt.Errorf("changing owner of %s: %w", path, err))
	}
	if _, err := f.ReadFrom(&bodyReader{content}); err != nil {
		var c *classed
		if errors.As(err, &c) {
			return fail(err)
		}
		return fail(fmt.Errorf("writing %s: %w", path, err))
	}
	if err := replaceMetadata(f, md); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		if created {
			_ = os.Remove(path)
		}
		return fmt.Errorf("closing %s: %w", path, err)
	}
	return nil
}

// bodyReader classifies read errors of the upload so they stay distinct
// from write errors (and hides fast paths of os.File.ReadFrom).
type bodyReader struct{ r io.Reader }

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		err = bodyError("reading upload", err)
	}
	return n, err
}

// idleReader fails a read that waits longer than uploadIdle for data.
type idleReader struct {
	r  io.ReadCloser
	rc *http.ResponseController
}

func (i *idleReader) Read(p []byte) (int, error) {
	_ = i.rc.SetReadDeadline(time.Now().Add(uploadIdle))
	return i.r.Read(p)
}

func (i *idleReader) Close() error {
	_ = i.rc.SetReadDeadline(time.Time{})
	return i.r.Close()
}

// limitedReadCloser fails with kindTooLarge once more than limit bytes
// have been read.
type limitedReadCloser struct {
	r      io.Reader
	limit  int64
	read   int64
	closer io.Closer
}

func (l *limitedReadCloser) Read(p []byte) (int, error) {
	if left := l.limit - l.read + 1; int64(len(p)) > left {
		p = p[:left]
	}
	n, err := l.r.Read(p)
	l.read += int64(n)
	if l.read > l.limit {
		return 0, newErr(kindTooLarge, "upload is larger than %d bytes once decompressed", l.limit)
	}
	return n, err
}

func (l *limitedReadCloser) Close() error { return l.closer.Close() }
