// Package downloads serves bcd release binaries to the install script and
// to nodes that upgrade: GET /downloads/bcd/{version}/{file}. A version
// published in the control plane (Published) is served from there:
// manifest.json (the signed envelope), linux-{arch}, linux-{arch}.sha256
// and linux-{arch}.sbom.json. Any other version is served from a directory
// laid out the same way (linux-{arch} and its .sha256 only).
//
// It must never serve anything outside that layout: versions and file
// names are checked against a strict pattern, so no request can name
// another file or climb out of the directory.
package downloads

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

var (
	versionRE = regexp.MustCompile(`^v?[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$`)
	// fileRE is what a published release serves.
	fileRE = regexp.MustCompile(`^(manifest\.json|linux-(amd64|arm64)(\.sha256|\.sbom\.json)?)$`)
	// dirFileRE is what the directory serves.
	dirFileRE = regexp.MustCompile(`^linux-(amd64|arm64)(\.sha256)?$`)
)

// Content is a file a published release serves.
type Content struct {
	io.ReadSeeker
	ModTime time.Time
	// Close releases the content; nil when there is nothing to release.
	Close func() error
}

// Published finds the files of releases published in the control plane.
type Published interface {
	// Open returns file of the published release version. published is
	// false when the version is not published (the directory serves it
	// then); a published release without the file answers published true
	// and a nil Content.
	Open(ctx context.Context, version, file string) (c *Content, published bool, err error)
}

// Handler serves published releases from pub (nil: none) and, for the
// versions not published, dir/bcd/{version}/linux-{arch}[.sha256].
func Handler(dir string, pub Published) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /downloads/bcd/{version}/{file}", func(w http.ResponseWriter, r *http.Request) {
		version, file := r.PathValue("version"), r.PathValue("file")
		if !versionRE.MatchString(version) || version == "." || version == ".." || !fileRE.MatchString(file) {
			http.NotFound(w, r)
			return
		}
		if pub != nil {
			c, published, err := pub.Open(r.Context(), version, file)
			switch {
			case err != nil:
				http.Error(w, "release unavailable", http.StatusServiceUnavailable)
				return
			case published && c == nil:
				http.NotFound(w, r)
				return
			case published:
				if c.Close != nil {
					defer func() { _ = c.Close() }()
				}
				serve(w, r, file, c.ModTime, c)
				return
			}
		}
		if !dirFileRE.MatchString(file) {
			http.NotFound(w, r)
			return
		}
		p := filepath.Join(dir, "bcd", version, file)
		f, err := os.Open(p)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		defer func() { _ = f.Close() }()
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			http.NotFound(w, r)
			return
		}
		serve(w, r, file, st.ModTime(), f)
	})
	return mux
}

func serve(w http.ResponseWriter, r *http.Request, file string, mod time.Time, content io.ReadSeeker) {
	switch {
	case strings.HasSuffix(file, ".sha256"):
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	case strings.HasSuffix(file, ".json"):
		w.Header().Set("Content-Type", "application/json")
	default:
		w.Header().Set("Content-Type", "application/octet-stream")
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(w, r, file, mod, content)
}
