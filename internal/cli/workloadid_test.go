package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// TestWorkloadToken: the command prints a token for a tenant's reservation
// that parses as an ES256 JWT naming it, -o json its claims too; another
// tenant's key gets NOT_FOUND for the same id.
func TestWorkloadToken(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	keys := map[string]string{}
	ids := map[string]string{}
	for _, name := range []string{"acme", "other"} {
		tn, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		ids[name] = tn.Msg.GetTenant().GetId()
		k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: name, Role: "admin"}))
		require.NoError(t, err)
		keys[name] = k.Msg.GetSecret()
	}
	p, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
	require.NoError(t, err)
	now := cp.Clock.Now()
	rsv := envelope.NewID(reservation.IDPrefix, now)
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO reservations (id, tenant_id, project_id, pool_id, state, gpus, model, gpu_model,
				vcpu, memory_gib, binding, starts_at, ends_at, active_since, created_by, create_time, update_time)
			VALUES ($1, $2, $3, 'pool_x', 'active', 1, 'H100', 'H100', 0, 0, 'none', $4, $5, $4, 'test', $4, $4)`,
			rsv, ids["acme"], p.Msg.GetProject().GetId(), now, now.Add(time.Hour))
		return err
	}))
	dir := t.TempDir()
	cli := func(key string, argv ...string) (int, string, string) {
		env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: key, "HOME": dir}
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}

	code, out, errs := cli(keys["acme"], "workload-token", "reservation", rsv, "--audience", "https://registry.example", "--ttl", "5m")
	require.Equal(t, 0, code, errs)
	tok, err := jwt.ParseSigned(strings.TrimSpace(out), []jose.SignatureAlgorithm{jose.ES256})
	require.NoError(t, err)
	var c jwt.Claims
	require.NoError(t, tok.UnsafeClaimsWithoutVerification(&c))
	require.Equal(t, "tenant:acme:project:web:reservation:"+rsv, c.Subject)
	require.Equal(t, jwt.Audience{"https://registry.example"}, c.Audience)
	require.Equal(t, 5*time.Minute, c.Expiry.Time().Sub(c.IssuedAt.Time()))

	code, out, errs = cli(keys["acme"], "workload-token", "reservation", rsv, "--audience", "x", "-o", "json")
	require.Equal(t, 0, code, errs)
	var js map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &js))
	require.Equal(t, bctest.WorkloadIssuer, js["issuer"])
	require.NotEmpty(t, js["token"])

	code, _, errs = cli(keys["other"], "workload-token", "reservation", rsv, "--audience", "x")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "NOT_FOUND")
	code, _, errs = cli(keys["acme"], "workload-token", "reservation", rsv, "--audience", "x", "--ttl", "1.5s")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "ttl")
}
