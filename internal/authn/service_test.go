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
	"github.com/better-compute/better-compute/internal/authn"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/dirversion"
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

// TestRevokedKeyRefusedByEveryReplica: a key that authenticated on two
// replicas (and so sits in both caches) is refused by the very next request
// on either once one of them revokes it — the revocation moves the
// directory version on in its own transaction; no TTL, no message. A new
// key works at once on the other replica too, and the cache is used: a
// second request with a key reads nothing for it.
func TestRevokedKeyRefusedByEveryReplica(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	other := cp.NewReplica(t)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	key, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "member"}))
	require.NoError(t, err)
	whoami := func(c *bctest.ControlPlane) error {
		_, err := c.Client(key.Msg.GetSecret()).Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
		return err
	}
	stats := func(c *bctest.ControlPlane) dirversion.Stats {
		return c.App.Envelope.Directory().Stats(authn.KeyCacheName)
	}
	for _, c := range []*bctest.ControlPlane{cp, other} {
		require.NoError(t, whoami(c), "a new key works on every replica at once")
		before := stats(c)
		require.NoError(t, whoami(c))
		require.Equal(t, before.Hits+1, stats(c).Hits, "the second request is answered from the cache")
		require.Equal(t, before.Misses, stats(c).Misses)
	}

	_, err = admin.ApiKeys.Revoke(ctx, connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "acme", Id: key.Msg.GetApiKey().GetId()}))
	require.NoError(t, err)
	for _, c := range []*bctest.ControlPlane{other, cp} {
		err := whoami(c)
		require.Equal(t, "UNAUTHENTICATED", client.Code(err), "%v", err)
		require.Contains(t, err.Error(), "revoked")
	}
}

// TestPersonKeys: only a person who is a platform admin makes a person's
// key (a platform service key and any tenant's admin are refused, an
// agent's key cannot be one, and nothing is written), and a person's key
// is a human: it approves a confirmation another principal requested.
func TestPersonKeys(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin() // the bootstrap key: a person, platform admin
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	mk := func(c *client.Client, req *apiv1.CreateApiKeyRequest) (*apiv1.CreateApiKeyResponse, error) {
		res, err := c.ApiKeys.Create(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	svc, err := mk(admin, &apiv1.CreateApiKeyRequest{Name: "robot"})
	require.NoError(t, err)
	require.Equal(t, "service", svc.GetApiKey().GetKind())
	acmeAdmin, err := mk(admin, &apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"})
	require.NoError(t, err)

	before := 0
	count := func() int {
		var n int
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT count(*) FROM api_keys`).Scan(&n)
		}))
		return n
	}
	before = count()
	_, err = mk(cp.Client(svc.GetSecret()), &apiv1.CreateApiKeyRequest{Name: "alice", Person: true})
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "a service key vouches for no person: %v", err)
	_, err = mk(cp.Client(acmeAdmin.GetSecret()), &apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin", Person: true})
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "a tenant admin makes no person's key: %v", err)
	_, err = mk(admin, &apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "agent", Person: true})
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
	require.Equal(t, "person", client.Detail(err).GetViolations()[0].GetField())
	require.Equal(t, before, count(), "refused creates write nothing")

	alice, err := mk(admin, &apiv1.CreateApiKeyRequest{Name: "alice", Person: true})
	require.NoError(t, err)
	require.Equal(t, "user", alice.GetApiKey().GetKind())
	bob, err := mk(admin, &apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin", Name: "bob", Person: true})
	require.NoError(t, err)
	require.Equal(t, "user", bob.GetApiKey().GetKind())

	// An agent's delete waits for a human; the service key cannot approve
	// it, the person's key can.
	agent, err := mk(admin, &apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "agent"})
	require.NoError(t, err)
	_, err = cp.Client(agent.GetSecret()).Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
	require.NoError(t, err)
	_, err = cp.Client(agent.GetSecret()).Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "web"}))
	require.Equal(t, "CONFIRMATION_REQUIRED", client.Code(err), "%v", err)
	cfm := client.Detail(err).GetConfirmationId()
	require.NotEmpty(t, cfm)
	_, err = cp.Client(svc.GetSecret()).Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: cfm}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = cp.Client(bob.GetSecret()).Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: cfm}))
	require.NoError(t, err)
}
