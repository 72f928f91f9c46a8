// Package downloads serves bcd release binaries to the install script:
// GET /downloads/bcd/{version}/linux-{arch} and the .sha256 next to it,
// from a directory laid out the same way.
//
// It must never serve anything outside that layout: versions and
// architectures are checked against a strict pattern, so no request can
// name another file or climb out of the directory.
package downloads

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
)

var (
	versionRE = regexp.MustCompile(`^v?[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$`)
	fileRE    = regexp.MustCompile(`^linux-(amd64|arm64)(\.sha256)?$`)
)

// Handler serves dir/bcd/{version}/linux-{arch}[.sha256].
func Handler(dir string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /downloads/bcd/{version}/{file}", func(w http.ResponseWriter, r *http.Request) {
		version, file := r.PathValue("version"), r.PathValue("file")
		if !versionRE.MatchString(version) || version == "." || version == ".." || !fileRE.MatchString(file) {
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
		if filepath.Ext(file) == ".sha256" {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		} else {
			w.Header().Set("Content-Type", "application/octet-stream")
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		http.ServeContent(w, r, file, st.ModTime(), f)
	})
	return mux
}
