package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
)

// TestProviderAccountsCommands: the types and what they need, a create
// whose credential is a secret reference, a refusal naming its field
// (a token given as a setting), list, get without any value, delete.
func TestProviderAccountsCommands(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	dir := t.TempDir()
	env := map[string]string{envConfig: dir + "/config.yaml", envServer: cp.URL, envToken: cp.AdminKey, "HOME": dir}
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
		require.NotContains(t, out, "hc-s3cret")
		return out
	}
	ok("", "tenants", "create", "acme")
	ok("hc-s3cret\n", "secrets", "put", "hc-token", "--tenant", "acme")
	types := ok("", "provider-accounts", "types")
	require.Regexp(t, `hetzner-cloud\s+token\s+secret-ref\s+true`, types)

	code, _, errs := cli("", "provider-accounts", "create", "hc", "--tenant", "acme", "--type", "hetzner-cloud", "--setting", "token=hc-s3cret")
	require.NotZero(t, code)
	require.Contains(t, errs, "settings.token")
	require.Contains(t, errs, "is a credential")
	code, _, errs = cli("", "provider-accounts", "create", "hc", "--tenant", "acme", "--type", "hetzner-cloud", "--secret-ref", "token")
	require.NotZero(t, code)
	require.Contains(t, errs, "must be k=v")

	out := ok("", "provider-accounts", "create", "hc", "--tenant", "acme", "--type", "hetzner-cloud", "--secret-ref", "token=secret://hc-token")
	require.Contains(t, out, "token=secret://hc-token")
	require.Contains(t, ok("", "provider-accounts", "list", "--tenant", "acme"), "hetzner-cloud")
	require.Contains(t, ok("", "provider-accounts", "get", "hc", "--tenant", "acme", "-o", "json"), `"secret://hc-token"`)
	require.Contains(t, ok("", "provider-accounts", "delete", "hc", "--tenant", "acme"), "deleted hc")
	code, _, errs = cli("", "provider-accounts", "get", "hc", "--tenant", "acme")
	require.NotZero(t, code)
	require.Contains(t, errs, "not found")
}
