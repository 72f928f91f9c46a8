package devrig

import (
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// TestDevInstanceCatalog: dev's default flavor and IP pool are the
// platform's, every tenant sees the flavor, and a restart writes nothing.
func TestDevInstanceCatalog(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := t.Context()
	admin := cp.Admin()
	require.NoError(t, EnsureInstanceCatalog(ctx, admin))
	require.NoError(t, EnsureInstanceCatalog(ctx, admin), "a restart finds both")

	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	fl, err := admin.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Tenant: "acme", Flavor: Flavor}))
	require.NoError(t, err)
	require.Empty(t, fl.Msg.GetFlavor().GetTenantId(), "the platform's")
	p, err := admin.IPPools.Get(ctx, connect.NewRequest(&apiv1.GetIPPoolRequest{IpPool: IPPool}))
	require.NoError(t, err)
	require.Equal(t, "10.100.0.1", p.Msg.GetIpPool().GetGateway())
	require.EqualValues(t, 253, p.Msg.GetIpPool().GetSize())
	list, err := admin.Flavors.List(ctx, connect.NewRequest(&apiv1.ListFlavorsRequest{}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetFlavors(), 1, "one flavor after two starts")
}
