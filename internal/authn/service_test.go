package authn_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/store"
)

// TestApiKeyTTLEdges: a ttl whose nanoseconds overflow int64 once wrapped
// into an already-expired key answered with 200; it is refused naming the
// field, nothing is written, and the largest allowed ttl expires in the
// future.
func TestApiKeyTTLEdges(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	countKeys := func() int {
		var n int
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT count(*) FROM api_keys`).Scan(&n)
		}))
		return n
	}
	before := countKeys()
	const maxTTL = 10 * 365 * 24 * 3600
	for _, ttl := range []int64{1<<63 - 1, 1 << 62, 9_300_000_000, maxTTL + 1, -1} {
		_, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "viewer", TtlSeconds: ttl}))
		require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "ttl %d: %v", ttl, err)
		var fields []string
		for _, v := range client.Detail(err).GetViolations() {
			fields = append(fields, v.GetField())
		}
		require.Equal(t, []string{"ttl_seconds"}, fields, "ttl %d", ttl)
	}
	require.Equal(t, before, countKeys(), "a refused create writes nothing")

	res, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "viewer", TtlSeconds: maxTTL}))
	require.NoError(t, err)
	require.Equal(t, cp.Clock.Now().Add(maxTTL*time.Second).Unix(), res.Msg.GetApiKey().GetExpireTime().AsTime().Unix())
	// The key works: it is not born expired.
	_, err = cp.Client(res.Msg.GetSecret()).Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
}
