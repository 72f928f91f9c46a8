package app_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// A key is revoked by its id alone: a platform admin finds it in any
// tenant, a tenant admin in its own; another tenant's key is not found for
// a tenant admin, exactly as if it did not exist.
func TestRevokeKeyByIDWithoutTenant(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	for _, name := range []string{"acme", "sim"} {
		_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
	}
	key := func(tenant, role string) (string, string) {
		res, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role}))
		require.NoError(t, err)
		return res.Msg.GetApiKey().GetId(), res.Msg.GetSecret()
	}
	revoke := func(c *client.Client, id string) error {
		_, err := c.ApiKeys.Revoke(ctx, connect.NewRequest(&apiv1.RevokeApiKeyRequest{Id: id}))
		return err
	}

	member, _ := key("acme", "member")
	require.NoError(t, revoke(admin, member), "the platform admin finds a tenant's key by id")

	_, acmeAdminSecret := key("acme", "admin")
	acmeAdmin := cp.Client(acmeAdminSecret)
	own, _ := key("acme", "viewer")
	require.NoError(t, revoke(acmeAdmin, own), "a tenant admin finds its own tenant's key")

	foreign, _ := key("sim", "member")
	err := revoke(acmeAdmin, foreign)
	require.Equal(t, "NOT_FOUND", client.Code(err), "another tenant's key is not found: %v", err)
	err = revoke(acmeAdmin, "key_01j00000000000000000000000")
	require.Equal(t, "NOT_FOUND", client.Code(err))
	require.Equal(t, "NOT_FOUND", client.Code(revoke(admin, "key_01j00000000000000000000000")))

	// The foreign key is untouched.
	list, err := admin.ApiKeys.List(ctx, connect.NewRequest(&apiv1.ListApiKeysRequest{Tenant: "sim"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetApiKeys(), 1)
	require.Nil(t, list.Msg.GetApiKeys()[0].GetRevokeTime())
}
