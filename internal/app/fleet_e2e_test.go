package app_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/store"
)

type nodeRow struct {
	id, state, liveness string
	gpus, nvlinks       int
}

func readNode(t *testing.T, cp *bctest.ControlPlane) nodeRow {
	t.Helper()
	var n nodeRow
	err := cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		err := tx.QueryRow(ctx, `SELECT id, state, liveness FROM nodes ORDER BY id LIMIT 1`).Scan(&n.id, &n.state, &n.liveness)
		if err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM gpus WHERE node_id = $1`, n.id).Scan(&n.gpus); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM nvlinks WHERE node_id = $1`, n.id).Scan(&n.nvlinks)
	})
	if err != nil {
		return nodeRow{}
	}
	return n
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	bctest.WaitFor(t, what, cond)
}

// TestFleetSpine: a simulated bcd joins with a token, is adopted (active,
// ready, 8 GPUs with NVLink), runs a command round trip, goes unreachable
// and lost on the liveness schedule, and comes back with the same identity
// after a restart — with zero authorization-port calls on the fleet paths.
func TestFleetSpine(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "gpu"}))
	require.NoError(t, err)
	tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "gpu"}))
	require.NoError(t, err)

	// Fleet path: join, session, inventory. No decision may be made.
	cp.Authz.Reset()
	stateDir := t.TempDir()
	d, err := bctest.NewFakeDaemon(bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr, StateDir: stateDir})
	require.NoError(t, err)
	require.NoError(t, d.Join(ctx, tok.Msg.GetToken()))
	d.Start()
	defer func() { _ = d.Stop() }()
	eventually(t, "node ready with 8 GPUs", func() bool {
		n := readNode(t, cp)
		return n.state == "active" && n.liveness == "ready" && n.gpus == 8 && n.nvlinks > 0
	})
	require.Zero(t, cp.Authz.Calls(), "fleet paths make no authorization call")
	node := readNode(t, cp)
	require.Equal(t, d.NodeID(), node.id)

	// Command round trip: one decision for the API call, none for delivery.
	run, err := admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: node.id, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	cp.Authz.Reset()
	eventually(t, "command succeeded", func() bool {
		var state string
		_ = cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT state FROM commands WHERE id = $1`, run.Msg.GetCommand().GetId()).Scan(&state)
		})
		return state == "succeeded"
	})
	require.Zero(t, cp.Authz.Calls(), "delivery and the node's update make no authorization call")

	// Liveness: the node stops; time passes; the sweep marks it.
	require.NoError(t, d.Stop())
	cp.Clock.Advance(31 * time.Second)
	_, _, err = cp.App.Gateway.SweepLiveness(ctx)
	require.NoError(t, err)
	require.Equal(t, "unreachable", readNode(t, cp).liveness)
	cp.Clock.Advance(5 * time.Minute)
	_, _, err = cp.App.Gateway.SweepLiveness(ctx)
	require.NoError(t, err)
	require.Equal(t, "lost", readNode(t, cp).liveness)

	// Restart: same identity, no new token, ready again.
	d2, err := bctest.NewFakeDaemon(bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr, StateDir: stateDir})
	require.NoError(t, err)
	require.True(t, d2.Joined(), "the state dir keeps the identity")
	d2.Start()
	defer func() { _ = d2.Stop() }()
	eventually(t, "node ready again", func() bool { return readNode(t, cp).liveness == "ready" })
	require.Equal(t, node.id, d2.NodeID())
	require.Zero(t, cp.Authz.Calls(), "fleet paths make no authorization call")
}
