package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/store"
)

// TestSecretsCommands: put from standard input and from a file, versions,
// list and get without the value, a refusal naming its field, delete.
func TestSecretsCommands(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	dir := t.TempDir()
	env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: cp.AdminKey, "HOME": dir}
	cli := func(stdin string, argv ...string) (int, string, string) {
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(stdin), &out, &errb)
		return code, out.String(), errb.String()
	}
	ok := func(stdin string, argv ...string) string {
		t.Helper()
		code, out, errs := cli(stdin, argv...)
		require.Equal(t, 0, code, "%v: %s", argv, errs)
		require.NotContains(t, out, "piped-value")
		require.NotContains(t, out, "file-value")
		return out
	}
	out := ok("", "tenants", "create", "acme", "-o", "json")
	require.Contains(t, out, "tnt_")

	out = ok("piped-value\n", "secrets", "put", "api-token", "--tenant", "acme", "--description", "CI token")
	require.Contains(t, out, "secret://api-token")
	f := filepath.Join(dir, "value")
	require.NoError(t, os.WriteFile(f, []byte("file-value"), 0o600))
	out = ok("", "secrets", "put", "api-token", "--tenant", "acme", "--from-file", f)
	require.Regexp(t, `api-token\s+2\s+10 B`, out)
	require.Contains(t, ok("", "secrets", "list", "--tenant", "acme"), "api-token")
	require.Contains(t, ok("", "secrets", "get", "api-token", "--tenant", "acme", "-o", "json"), `"version": "2"`)

	// The value that landed is the file's, whole.
	sealer, err := pki.NewSealer(cp.Secret)
	require.NoError(t, err)
	var v secrets.Value
	require.NoError(t, cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var tid string
		if err := tx.QueryRow(ctx, `SELECT id FROM tenants WHERE name = 'acme'`).Scan(&tid); err != nil {
			return err
		}
		v, err = secrets.Open(ctx, tx, sealer, tid, "secret://api-token")
		return err
	}))
	require.Equal(t, "file-value", string(v.Bytes))

	code, _, errs := cli("", "secrets", "put", "empty", "--tenant", "acme")
	require.NotZero(t, code)
	require.Contains(t, errs, "value")
	require.Contains(t, errs, "is required")
	require.Contains(t, ok("", "secrets", "delete", "api-token", "--tenant", "acme"), "deleted api-token")
	code, _, errs = cli("", "secrets", "get", "api-token", "--tenant", "acme")
	require.NotZero(t, code)
	require.Contains(t, errs, "not found")
}
