package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/authn"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// TestTenantsLifecycleCLI: suspend shows in get and refuses the tenant's
// own writes, delete --dry-run lists the rows, and the delete itself needs
// a confirmation another person approves.
func TestTenantsLifecycleCLI(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	dir := t.TempDir()
	env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: cp.AdminKey, "HOME": dir}
	cli := func(token string, argv ...string) (int, string, string) {
		a := newApp("test", func(k string) (string, bool) {
			if k == envToken {
				return token, true
			}
			v, ok := env[k]
			return v, ok && v != ""
		})
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	ok := func(argv ...string) string {
		t.Helper()
		code, out, errs := cli(cp.AdminKey, argv...)
		require.Equal(t, 0, code, "%v: %s", argv, errs)
		return out
	}
	ok("tenants", "create", "acme")
	key, err := cp.Admin().ApiKeys.Create(context.Background(), connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
	require.NoError(t, err)
	acmeKey := key.Msg.GetSecret()

	require.Contains(t, ok("tenants", "suspend", "acme"), "suspended")
	require.Contains(t, ok("tenants", "get", "acme"), "suspended")
	code, _, errs := cli(acmeKey, "projects", "create", "web", "--tenant", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "TENANT_SUSPENDED")
	code, out, errs := cli(acmeKey, "tenants", "get", "acme")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "suspended")

	plan := ok("tenants", "delete", "acme", "--dry-run")
	require.Regexp(t, `(?m)^TABLE\s+ID`, plan)
	require.Regexp(t, `(?m)^api_keys\s+`+key.Msg.GetApiKey().GetId(), plan)
	require.Regexp(t, `(?m)^tenants\s+tnt_`, plan)
	require.Contains(t, ok("tenants", "get", "acme"), "acme", "a dry run deletes nothing")

	code, _, errs = cli(cp.AdminKey, "tenants", "delete", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "CONFIRMATION_REQUIRED")
	cfm := regexp.MustCompile(`cfm_[A-Za-z0-9]+`).FindString(errs)
	require.NotEmpty(t, cfm, errs)

	// Another person approves.
	secret, hash, err := authn.NewSecret()
	require.NoError(t, err)
	require.NoError(t, cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		now := cp.Clock.Now()
		return authn.KeyInsert(ctx, tx, authn.ApiKey{ID: envelope.NewID("key", now), Name: "second", Role: string(iam.RolePlatformAdmin),
			Kind: string(iam.KindUser), Prefix: secret[:8], SecretHash: hash, CreatedBy: "test", CreateTime: now})
	}))
	code, _, errs = cli(secret, "confirmations", "approve", cfm, "--tenant", "acme")
	require.Equal(t, 0, code, errs)

	gone := ok("tenants", "delete", "acme", "--confirmation-id", cfm)
	require.Regexp(t, `(?m)^tenants\s+tnt_`, gone)
	code, _, errs = cli(cp.AdminKey, "tenants", "get", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "NOT_FOUND")
}
