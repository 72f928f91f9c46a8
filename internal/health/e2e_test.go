package health_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/store"
)

// TestRemediationThroughAgents runs remediations end to end with real
// agents (fake hardware) over the gateway: bcd reports an XID, the finding
// takes the GPU out, the reconciler drains the node, the agent acknowledges
// the drain, the workflow sends the signed gpu.reset (or node.reboot) the
// agent applies, and the success lifts the GPU and undrains the node.
func TestRemediationThroughAgents(t *testing.T) {
	ctx := context.Background()
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.UnreachableAfter, c.LostAfter = 1000*time.Hour, 2000*time.Hour
		c.HealthInterval = 200 * time.Millisecond
	})
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr},
		Root:     t.TempDir(), N: 20,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	count := func(q string, args ...any) int {
		var n int
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error { return tx.QueryRow(ctx, q, args...).Scan(&n) }))
		return n
	}
	bctest.WaitFor(t, "the nodes' GPUs", func() bool { return count(`SELECT COUNT(*) FROM gpus`) == 8*20 })
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}},
		Policy:   &apiv1.PoolPolicy{OnNodeLost: "replace"}}))
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		node int
		code int64
		kind string
	}{{"XID 63 resets the GPU", 0, 63, "gpu.reset"}, {"XID 79 reboots the node", 1, 79, "node.reboot"}} {
		t.Run(tc.name, func(t *testing.T) {
			d := sim.Daemons[tc.node]
			nodeID := d.NodeID()
			var gpu string
			require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
				return tx.QueryRow(ctx, `SELECT uuid FROM gpus WHERE node_id = $1 AND idx = 2`, nodeID).Scan(&gpu)
			}))
			d.ReportHealthEvent(&agentv1.HealthEvent{Kind: "gpu.xid", Device: gpu, Code: tc.code, Message: "injected"})
			bctest.WaitFor(t, "the GPU taken out", func() bool {
				return count(`SELECT COUNT(*) FROM atoms WHERE gpu_uuid = $1 AND quarantined`, gpu) == 1
			})
			bctest.WaitFor(t, "the remediation's command to the agent to succeed", func() bool {
				return count(`SELECT COUNT(*) FROM commands WHERE node_id = $1 AND kind = $2 AND state = 'succeeded'`, nodeID, tc.kind) == 1
			})
			bctest.WaitFor(t, "the remediation to succeed", func() bool {
				return count(`SELECT COUNT(*) FROM health_remediations WHERE node_id = $1 AND state = 'succeeded'`, nodeID) == 1
			})
			require.Equal(t, 0, count(`SELECT COUNT(*) FROM atoms WHERE gpu_uuid = $1 AND quarantined`, gpu), "the GPU is back in placement")
			require.Equal(t, 1, count(`SELECT COUNT(*) FROM nodes WHERE id = $1 AND state = 'active'`, nodeID), "the node is back in service")
			require.Equal(t, 1, count(`SELECT COUNT(*) FROM commands WHERE node_id = $1 AND kind = 'node.drain'`, nodeID), "drained once")
		})
	}
}
