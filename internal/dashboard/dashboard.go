// Package dashboard is cellfork's web dashboard: static files (no
// framework, no build step) embedded in the binary, served by the daemon
// at /dashboard/ and, in cluster mode, by the gateway. The page asks for
// an API key and calls the public HTTP API with it, so it needs nothing
// from the server but these files.
package dashboard

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
)

//go:embed static
var static embed.FS

// file is one embedded file, ready to serve.
type file struct {
	body  []byte
	ctype string
	etag  string
}

var files = func() map[string]file {
	m := map[string]file{}
	sub, _ := fs.Sub(static, "static")
	_ = fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(sub, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		m["/"+p] = file{body: b, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	return m
}()

// csp allows the page's own script and style only (no inline code), API
// calls to its own origin, and images from data: URLs (plots that code
// returns).
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the dashboard's files; mount it with the prefix
// stripped (GET /dashboard/app.js -> /app.js). Every other path is the
// page itself, whose script routes on the URL's fragment.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		f, ok := files[p]
		if !ok {
			if strings.Contains(path.Base(p), ".") {
				http.NotFound(w, r)
				return
			}
			f = files["/index.html"]
		}
		h := w.Header()
		h.Set("Content-Type", f.ctype)
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache") // revalidate: the ETag makes it cheap
		h.Set("ETag", f.etag)
		if r.Header.Get("If-None-Match") == f.etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		_, _ = w.Write(f.body)
	})
}
