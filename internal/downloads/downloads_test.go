package downloads

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHandler(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	v := filepath.Join(dir, "bcd", "v1.2.3")
	require.NoError(t, os.MkdirAll(v, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(v, "linux-amd64"), []byte("ELF"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(v, "linux-amd64.sha256"), []byte("abc  bcd\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "secret"), []byte("no"), 0o600))
	require.NoError(t, os.MkdirAll(filepath.Join(v, "linux-arm64"), 0o755))
	h := Handler(dir, nil)
	tests := []struct {
		method, path string
		code         int
		body         string
	}{
		{"GET", "/downloads/bcd/v1.2.3/linux-amd64", 200, "ELF"},
		{"GET", "/downloads/bcd/v1.2.3/linux-amd64.sha256", 200, "abc  bcd\n"},
		{"GET", "/downloads/bcd/v1.2.3/linux-arm64", 404, ""},
		{"GET", "/downloads/bcd/v9/linux-amd64", 404, ""},
		{"GET", "/downloads/bcd/v1.2.3/linux-mips", 404, ""},
		{"GET", "/downloads/bcd/../secret", 404, ""},
		{"GET", "/downloads/bcd/..%2f..%2fsecret/linux-amd64", 404, ""},
		{"GET", "/downloads/bcd/%2e%2e/linux-amd64", 404, ""},
		{"GET", "/downloads/other/v1.2.3/linux-amd64", 404, ""},
		{"POST", "/downloads/bcd/v1.2.3/linux-amd64", 405, ""},
	}
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
		got := rec.Code
		if got == http.StatusMovedPermanently || got == http.StatusTemporaryRedirect {
			got = 404 // the mux cleans "..": never a file
		}
		require.Equal(t, tt.code, got, tt.path)
		if tt.body != "" {
			require.Equal(t, tt.body, rec.Body.String(), tt.path)
		}
	}
}

// published is a Published of one release, v2.0.0, with linux-amd64 only.
type published struct{ asked []string }

func (p *published) Open(_ context.Context, version, file string) (*Content, bool, error) {
	p.asked = append(p.asked, version+"/"+file)
	switch {
	case version == "v9.9.9":
		return nil, false, errors.New("database down")
	case version != "v2.0.0":
		return nil, false, nil
	case file == "manifest.json" || strings.HasPrefix(file, "linux-amd64"):
		return &Content{ReadSeeker: strings.NewReader("published " + file), ModTime: time.Unix(0, 0)}, true, nil
	}
	return nil, true, nil
}

func TestHandlerServesPublishedReleasesFirst(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, v := range []string{"v1.2.3", "v2.0.0"} {
		d := filepath.Join(dir, "bcd", v)
		require.NoError(t, os.MkdirAll(d, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "linux-arm64"), []byte("dir "+v), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "manifest.json"), []byte("unsigned"), 0o644))
	}
	pub := &published{}
	h := Handler(dir, pub)
	tests := []struct {
		path string
		code int
		body string
	}{
		{"/downloads/bcd/v2.0.0/manifest.json", 200, "published manifest.json"},
		{"/downloads/bcd/v2.0.0/linux-amd64", 200, "published linux-amd64"},
		{"/downloads/bcd/v2.0.0/linux-amd64.sha256", 200, "published linux-amd64.sha256"},
		{"/downloads/bcd/v2.0.0/linux-amd64.sbom.json", 200, "published linux-amd64.sbom.json"},
		// A published release is served whole from the control plane: the
		// directory never fills in a file it lacks.
		{"/downloads/bcd/v2.0.0/linux-arm64", 404, ""},
		// Other versions come from the directory, binaries and digests only.
		{"/downloads/bcd/v1.2.3/linux-arm64", 200, "dir v1.2.3"},
		{"/downloads/bcd/v1.2.3/manifest.json", 404, ""},
		{"/downloads/bcd/v1.2.3/linux-arm64.sbom.json", 404, ""},
		{"/downloads/bcd/v9.9.9/linux-amd64", 503, ""},
		{"/downloads/bcd/v2.0.0/linux-amd64.sig", 404, ""},
		{"/downloads/bcd/v2.0.0/manifest.json.sha256", 404, ""},
	}
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", tt.path, nil))
		require.Equal(t, tt.code, rec.Code, tt.path)
		if tt.body != "" {
			require.Equal(t, tt.body, rec.Body.String(), tt.path)
		}
	}
	// A name outside the layout never reaches the store.
	require.NotContains(t, pub.asked, "v2.0.0/linux-amd64.sig")
	require.NotContains(t, pub.asked, "v2.0.0/manifest.json.sha256")
}
