package app_test

import (
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
	"github.com/better-compute/better-compute/internal/store"
)

// TestCapacitySpine: two simulated nodes join, a pool adopts them by label,
// a 4-GPU reservation is placed inside one NVLink island, bound on the node
// (which writes the cgroup limits) and active; the node is lost, the
// reservation shows NodeLost and is released. Fleet paths make no
// authorization call; each API mutation makes exactly one.
func TestCapacitySpine(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)

	root := t.TempDir()
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: root, N: 2,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	defer sim.Stop()
	eventually(t, "two nodes with 8 GPUs each", func() bool { return countRows(t, cp, `SELECT COUNT(*) FROM gpus`) == 16 })

	cp.Authz.Reset()
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "gpu",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	require.EqualValues(t, 1, cp.Authz.Calls(), "one decision per mutation")
	require.Equal(t, 16, countRows(t, cp, `SELECT COUNT(*) FROM atoms a JOIN node_pools np ON np.node_id = a.node_id
		WHERE np.pool_id <> '' AND a.kind = 'gpu'`), "both nodes joined the pool by label")

	cp.Authz.Reset()
	res, err := admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "acme", Pool: "gpu", Gpus: 4, DurationSeconds: 3600}))
	require.NoError(t, err)
	require.EqualValues(t, 1, cp.Authz.Calls(), "one decision per mutation")
	rsv := res.Msg.GetReservation()
	require.Len(t, rsv.GetPlacement().GetAtoms(), 4)
	require.GreaterOrEqual(t, rsv.GetPlacement().GetIsland(), int32(0), "four GPUs of one NVLink island")

	// The node binds it: allocation.bind → cgroup limits → AllocationBound.
	cp.Authz.Reset()
	var got *apiv1.Reservation
	eventually(t, "reservation active", func() bool {
		g, err := admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: rsv.GetId()}))
		require.NoError(t, err)
		got = g.Msg.GetReservation()
		return got.GetState() == "active"
	})
	var bound *bctest.FakeDaemon
	for _, d := range sim.Daemons {
		if d.NodeID() == got.GetPlacement().GetNodeId() {
			bound = d
		}
	}
	require.NotNil(t, bound)
	cg := filepath.Join(bound.CgroupRoot(), rsv.GetId())
	cpus, err := os.ReadFile(filepath.Join(cg, "cpuset.cpus"))
	require.NoError(t, err, "the agent wrote the allocation's cgroup")
	require.Equal(t, got.GetPlacement().GetCpuset(), strings.TrimSpace(string(cpus)))
	mem, err := os.ReadFile(filepath.Join(cg, "memory.max"))
	require.NoError(t, err)
	require.NotEqual(t, "max", strings.TrimSpace(string(mem)), "a memory limit from the per-GPU share")
	// The node is lost: the reservation shows NodeLost and is released.
	cp.Authz.Reset()
	require.NoError(t, bound.Stop())
	cp.Clock.Advance(6 * time.Minute)
	_, _, err = cp.App.Gateway.SweepLiveness(ctx)
	require.NoError(t, err)
	require.Zero(t, cp.Authz.Calls(), "the fleet paths make no authorization call")
	g, err := admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: rsv.GetId()}))
	require.NoError(t, err)
	got = g.Msg.GetReservation()
	require.Equal(t, "released", got.GetState())
	require.True(t, hasCondition(got, "NodeLost", "true"), "conditions: %v", got.GetConditions())

	// Releasing again changes nothing.
	cp.Authz.Reset()
	rel, err := admin.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: rsv.GetId()}))
	require.NoError(t, err)
	require.Equal(t, "released", rel.Msg.GetReservation().GetState())
	require.EqualValues(t, 1, cp.Authz.Calls())
	require.Zero(t, countRows(t, cp, `SELECT COUNT(*) FROM bookings WHERE reservation_id = $1 AND ends_at > $2`,
		rsv.GetId(), cp.Clock.Now()), "no booking outlives its reservation")
}

func hasCondition(r *apiv1.Reservation, typ, status string) bool {
	for _, c := range r.GetConditions() {
		if c.GetType() == typ && c.GetStatus() == status {
			return true
		}
	}
	return false
}

func countRows(t *testing.T, cp *bctest.ControlPlane, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}
