package app_test

import (
	"context"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/store"
)

// TestNodeFollowsLiveReplica is the failover of issue 21: two replicas on
// one PostgreSQL, bcd given both gateways, its session and the pool's
// placer on the first. That replica is killed; the node's session comes up
// on the survivor, and a new reservation there binds on the node and turns
// active instead of sitting in binding.
func TestNodeFollowsLiveReplica(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	if !cp.App.DB.SupportsListener() {
		t.Skip("several replicas need PostgreSQL; set BC_TEST_POSTGRES_URL")
	}
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "gpu"}))
	require.NoError(t, err)
	tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "gpu"}))
	require.NoError(t, err)
	first := cp.NewReplica(t)

	d, err := bctest.NewFakeDaemon(bctest.FakeDaemonConfig{Gateway: first.GatewayAddr + "," + cp.GatewayAddr, StateDir: filepath.Join(t.TempDir(), "node")})
	require.NoError(t, err)
	require.NoError(t, d.Join(ctx, tok.Msg.GetToken()))
	d.Start()
	t.Cleanup(func() { _ = d.Stop() })
	owner := func() (owner, liveness string) {
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT session_owner, liveness FROM nodes WHERE id = $1`, d.NodeID()).Scan(&owner, &liveness)
		}))
		return owner, liveness
	}
	eventually(t, "the node ready on the first replica, with its GPUs", func() bool {
		o, l := owner()
		return o == first.App.Gateway.ReplicaID() && l == "ready" && readNode(t, cp).gpus == 8
	})
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "gpu",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	active := func(c *bctest.ControlPlane, what string) {
		t.Helper()
		var res *connect.Response[apiv1.CreateReservationResponse]
		eventually(t, what+": placed", func() bool {
			// The placer reads the pool's nodes once they are indexed;
			// until then it answers FAILED_PRECONDITION.
			var err error
			res, err = c.Admin().Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
				Tenant: "acme", Pool: "gpu", Gpus: 2, DurationSeconds: 3600}))
			return err == nil
		})
		eventually(t, what, func() bool {
			g, err := c.Admin().Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: res.Msg.GetReservation().GetId()}))
			require.NoError(t, err)
			return g.Msg.GetReservation().GetState() == "active"
		})
	}
	// Placed through the first replica, which so owns the pool's placer.
	active(first, "a reservation active through the first replica")

	first.Kill(t)
	eventually(t, "the node's session on the survivor", func() bool {
		o, l := owner()
		return o == cp.App.Gateway.ReplicaID() && l == "ready"
	})
	// The owner row comes before bcd reads the HelloAck.
	eventually(t, "bcd's session on the survivor", func() bool { return d.Gateway() == cp.GatewayAddr })
	active(cp, "a new reservation active on the survivor")
}
