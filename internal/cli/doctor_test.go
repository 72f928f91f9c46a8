package cli

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	bcapp "github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/storeopen"
)

// TestDoctor: on a database serve never migrated, doctor fails the
// migrations check and says to start serve; migrated with a PKI it passes,
// warns of a CA ending within --cert-warn, and fails a gateway that does
// not answer; support-bundle carries the findings and versions and none of
// the credentials in the log it was given.
func TestDoctor(t *testing.T) {
	t.Parallel()
	state := pkiStateDir(t)
	r := runPKI(t, "doctor", "--state-dir", state)
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Regexp(t, `(?m)^migrations\s+fail\s+\d+ pending: `, r.stdout)
	require.Contains(t, r.stdout, "start serve")
	require.Contains(t, r.stderr, "doctor found failures")

	ctx := context.Background()
	db, err := storeopen.Open(ctx, store.Config{StateDir: state})
	require.NoError(t, err)
	require.NoError(t, db.Migrate(ctx, bcapp.Modules()...))
	require.NoError(t, db.Migrate(ctx, pki.Migrations()))
	require.NoError(t, db.Close())
	r = runPKI(t, "doctor", "--state-dir", state)
	require.Equal(t, 0, r.code, "no PKI is a warning, not a failure: %s", r.stdout)
	require.Regexp(t, `(?m)^migrations\s+ok\s`, r.stdout)
	require.Regexp(t, `(?m)^certificates\s+warn\s+no PKI`, r.stdout)
	require.Zero(t, runPKI(t, "pki", "init", "--state-dir", state, "--trust-domain", "doctor.example.com").code)

	r = runPKI(t, "doctor", "--state-dir", state)
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	for _, check := range []string{"database", "migrations", "clock", "certificates", "nodes"} {
		require.Regexp(t, `(?m)^`+check+`\s+ok\s`, r.stdout)
	}
	r = runPKI(t, "doctor", "--state-dir", state, "--cert-warn", "100000h", "--gateway", "127.0.0.1:1", "-o", "json")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stdout, `"status": "warn"`)
	require.Contains(t, r.stdout, `"check": "gateway"`)
	require.Contains(t, r.stdout, "pki rotate")

	logFile := filepath.Join(t.TempDir(), "serve.log")
	require.NoError(t, os.WriteFile(logFile, []byte("level=INFO msg=start\nAuthorization: Bearer bc_0123456789abcdef\njoin token=bcjt_abcdefghijklmnop\n"+
		"password: hunter22\n"), 0o600))
	out := filepath.Join(t.TempDir(), "bundle.tar.gz")
	r = runPKI(t, "support-bundle", "--state-dir", state, "--out", out, "--log-file", logFile)
	require.Equal(t, 0, r.code, r.stderr)
	f, err := os.Open(out)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	tr := tar.NewReader(zr)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[strings.TrimPrefix(h.Name, "bc-support/")] = string(b)
	}
	require.Contains(t, files["versions.txt"], "better-compute v1.2.3")
	require.Regexp(t, `(?m)^migrations\s+ok`, files["doctor.txt"])
	log := files["serve.log"]
	require.Contains(t, log, "level=INFO msg=start")
	for _, secret := range []string{"bc_0123456789abcdef", "bcjt_abcdefghijklmnop", "hunter22"} {
		for name, body := range files {
			require.NotContains(t, body, secret, name)
		}
	}
	require.Contains(t, log, "[redacted]")
}
