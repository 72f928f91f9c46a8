package downloads

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

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
	h := Handler(dir)
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
