package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// TestIAMSetup runs the first-run setup against a real control plane:
// the questions, a plan file applied again over it, a bad plan that writes
// nothing, a declined plan, and another tenant's admin who cannot use it
// to reach a tenant not its own.
func TestIAMSetup(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	cli := func(tok, stdin string, argv ...string) (int, string, string) {
		env := map[string]string{envConfig: cfg, envServer: cp.URL, envToken: tok, "HOME": dir}
		a := newApp("test", func(k string) (string, bool) {
			v, ok := env[k]
			return v, ok && v != ""
		})
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(stdin), &out, &errb)
		return code, out.String(), errb.String()
	}
	ctx := context.Background()
	tenantExists := func(name string) bool {
		_, err := cp.Admin().Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: name}))
		if err != nil {
			require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), err)
		}
		return err == nil
	}

	// Declined: nothing is written.
	code, _, errs := cli(cp.AdminKey, "ops\n\n\n\n-\nn\n", "iam", "setup")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "nothing applied")
	require.False(t, tenantExists("ops"))

	// The questions, answered.
	code, out, errs := cli(cp.AdminKey, "ops\ndefault, web\nadmin:alice,viewer\ny\n-\ny\n", "iam", "setup")
	require.Equal(t, 0, code, errs)
	require.Contains(t, errs, "Tenant for your operators [ops]")
	require.Regexp(t, `(?m)^tenant\s+ops\s+created\s+tnt_`, out)
	require.Regexp(t, `(?m)^project\s+web\s+created`, out)
	require.Regexp(t, `(?m)^api-key\s+alice \(admin\)\s+created, saved as context ops-alice`, out)
	require.Regexp(t, `(?m)^api-key\s+viewer \(viewer\)\s+created, saved as context ops-viewer`, out)
	require.Equal(t, 2, strings.Count(out, "shown once"), out)

	// The saved context works, with the tenant and role it was made for.
	code, out, errs = cli("", "", "--context", "ops-alice", "whoami")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "admin")
	require.Contains(t, out, "ops")

	// A plan file over it: what exists is kept, no secret is minted twice,
	// the policy is applied, the new key made.
	pol := filepath.Join(dir, "confirm.cedar")
	require.NoError(t, os.WriteFile(pol, []byte("permit (principal, action, resource) when { principal.tenant == resource.tenant };\n"), 0o600))
	plan := filepath.Join(dir, "setup.yaml")
	require.NoError(t, os.WriteFile(plan, []byte(`tenant: ops
projects: [default]
policies:
  - id: tenant-only
    file: confirm.cedar
keys:
  - {role: admin, name: alice}
  - {role: operator, name: oncall, ttl: 720h}
`), 0o600))
	code, out, errs = cli(cp.AdminKey, "", "iam", "setup", "--file", plan)
	require.Equal(t, 0, code, errs)
	require.Regexp(t, `(?m)^tenant\s+ops\s+kept`, out)
	require.Regexp(t, `(?m)^project\s+default\s+kept`, out)
	require.Regexp(t, `(?m)^policy\s+tenant-only\s+applied`, out)
	require.Regexp(t, `(?m)^api-key\s+alice \(admin\)\s+kept`, out)
	require.Regexp(t, `(?m)^api-key\s+oncall \(operator\)\s+created`, out)
	require.Equal(t, 1, strings.Count(out, "shown once"), out)

	// A bad plan names every bad field and writes nothing.
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte(`tenant: fresh
projects: [Web]
keys:
  - {role: root}
  - {role: admin, ttl: soon}
`), 0o600))
	code, _, errs = cli(cp.AdminKey, "", "iam", "setup", "-f", bad)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "INVALID_ARGUMENT")
	for _, f := range []string{"projects[0]", "keys[0].role", "keys[1].ttl"} {
		require.Contains(t, errs, f)
	}
	require.False(t, tenantExists("fresh"), "a bad plan writes nothing")
	code, _, errs = cli(cp.AdminKey, "tenant: fresh\nkeyz: []\n", "iam", "setup", "-f", "-")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "keyz")
	require.False(t, tenantExists("fresh"))

	// Another tenant's admin: cannot create a tenant nor reach ops.
	_, err := cp.Admin().Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	key, err := cp.Admin().ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
	require.NoError(t, err)
	acme := key.Msg.GetSecret()
	code, _, errs = cli(acme, "tenant: ops\nkeys: [{role: admin, name: mallory}]\n", "iam", "setup", "-f", "-")
	require.Equal(t, 1, code)
	require.Regexp(t, `NOT_FOUND|PERMISSION_DENIED`, errs)
	code, _, errs = cli(acme, "tenant: evil\n", "iam", "setup", "-f", "-")
	require.Equal(t, 1, code)
	require.Regexp(t, `NOT_FOUND|PERMISSION_DENIED`, errs)
	require.False(t, tenantExists("evil"))
	keys, err := cp.Admin().ApiKeys.List(ctx, connect.NewRequest(&apiv1.ListApiKeysRequest{Tenant: "ops"}))
	require.NoError(t, err)
	for _, k := range keys.Msg.GetApiKeys() {
		require.NotEqual(t, "mallory", k.GetName())
	}

	// A tenant admin may run it for its own tenant.
	code, out, errs = cli(acme, "tenant: acme\nprojects: [ml]\n", "iam", "setup", "-f", "-")
	require.Equal(t, 0, code, errs)
	require.Regexp(t, `(?m)^project\s+ml\s+created`, out)
}
