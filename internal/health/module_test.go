package health_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/store"
)

func TestPolicyActions(t *testing.T) {
	f := newFleet(t, 4, &apiv1.PoolPolicy{Health: &apiv1.HealthPolicy{XidActions: map[int64]string{31: "quarantine"}}})
	n := f.nodeIDs[0]
	g := f.gpusOf[n]
	atomOut := func(uuid string) bool {
		return f.count(t, `SELECT COUNT(*) FROM atoms WHERE gpu_uuid = $1 AND quarantined`, uuid) > 0
	}

	f.xid(t, n, g[0], 13)
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM health_findings WHERE gpu_uuid = $1 AND action = 'record' AND severity = 'warning'`, g[0]))
	require.False(t, atomOut(g[0]), "XID 13 is recorded, the GPU stays in placement")

	f.xid(t, n, g[1], 48)
	require.True(t, atomOut(g[1]), "XID 48 quarantines the GPU")
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM health_gpus WHERE gpu_uuid = $1 AND state = 'quarantined'`, g[1]))
	require.Equal(t, "active", nodeState(t, f, n), "a quarantine leaves the node schedulable")

	f.xid(t, n, g[2], 64)
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM health_gpus WHERE gpu_uuid = $1 AND state = 'rma'`, g[2]), "XID 64 marks for RMA")

	f.xid(t, n, g[3], 31)
	require.True(t, atomOut(g[3]), "the pool's policy overrides XID 31 to quarantine")

	f.xid(t, n, g[4], 63)
	rs := f.remediations(t, health.RemPending)
	require.Len(t, rs, 1, "XID 63 queues a reset")
	require.Equal(t, "reset", rs[0].Action)
	require.Equal(t, g[4], rs[0].GPUUUID)

	f.xid(t, n, g[5], 79)
	rs = f.remediations(t, health.RemPending)
	require.Len(t, rs, 1, "one active remediation per node")
	require.Equal(t, "reboot", rs[0].Action, "a reboot asked for while a reset waits folds them into one reboot")
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM health_findings WHERE remediation_id = $1`, rs[0].ID))

	// An operator lifts a quarantine: the GPU rejoins placement and its
	// findings are resolved.
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		node, gref := nodeAndGPU(ctx, t, tx, g[1])
		resolved, err := f.hm.LiftGPU(ctx, tx, node, gref, "reseated", "test:operator")
		require.Equal(t, 1, resolved)
		return err
	}))
	require.False(t, atomOut(g[1]), "a lifted GPU is placeable again")
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM health_findings WHERE gpu_uuid = $1 AND state = 'open'`, g[1]))
}

func TestStandingFindings(t *testing.T) {
	f := newFleet(t, 2, nil)
	n := f.nodeIDs[0]
	g := f.gpusOf[n]
	pcie := &agentv1.HealthEvent{Kind: "gpu.pcie_degraded", Device: g[0], Message: "x8 of x16"}
	ecc := &agentv1.HealthEvent{Kind: "gpu.ecc_uncorrectable", Device: g[1], Code: 2, Severity: "error"}
	f.report(t, n, nil, []*agentv1.HealthEvent{pcie, ecc}, true)
	f.report(t, n, nil, []*agentv1.HealthEvent{pcie, ecc}, true)
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM health_findings WHERE node_id = $1 AND state = 'open' AND standing`, n))
	require.Equal(t, 2, f.count(t, `SELECT MAX(count) FROM health_findings WHERE gpu_uuid = $1`, g[0]), "a repeat counts on the open finding")
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM health_gpus WHERE gpu_uuid = $1`, g[1]), "uncorrectable ECC quarantines")
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM health_gpus WHERE gpu_uuid = $1`, g[0]), "a degraded link is recorded")

	// A report that is not complete resolves nothing; a complete one
	// without the link resolves it.
	f.report(t, n, nil, []*agentv1.HealthEvent{ecc}, false)
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM health_findings WHERE node_id = $1 AND state = 'open'`, n))
	f.report(t, n, nil, []*agentv1.HealthEvent{ecc}, true)
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM health_findings WHERE node_id = $1 AND state = 'open'`, n))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM health_findings WHERE gpu_uuid = $1 AND state = 'resolved' AND resolved_by = 'node'`, g[0]))
	// A standing finding's quarantine stays until an operator lifts it.
	f.report(t, n, nil, nil, true)
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM health_gpus WHERE gpu_uuid = $1`, g[1]))
}

func TestBudgetAndBreaker(t *testing.T) {
	// 40 nodes: a budget of 2 (5 %), a breaker limit of 4 (10 %).
	f := newFleet(t, 40, &apiv1.PoolPolicy{OnNodeLost: "replace"})
	for i := range 3 {
		f.xid(t, f.nodeIDs[i], f.gpusOf[f.nodeIDs[i]][0], 63)
	}
	f.reconcile(t)
	require.Len(t, f.remediations(t, health.RemDraining), 2, "two drain at once: the budget")
	require.Len(t, f.remediations(t, health.RemPending), 1)
	st := poolStatus(t, f.db, f.poolID, f.cp.Clock.Now())
	require.Equal(t, 2, st.Budget)
	require.Equal(t, 2, st.BudgetUsed)
	require.Equal(t, health.BreakerClosed, st.Breaker.State, "three of forty is no fleet-wide cause")

	// Two more nodes within the window: five of forty trips it.
	for i := 3; i < 5; i++ {
		f.xid(t, f.nodeIDs[i], f.gpusOf[f.nodeIDs[i]][0], 79)
	}
	f.ackDrains(t)
	f.reconcile(t)
	st = poolStatus(t, f.db, f.poolID, f.cp.Clock.Now())
	require.Equal(t, health.BreakerOpen, st.Breaker.State)
	require.Contains(t, st.Breaker.Reason, "5 of the pool's 40 nodes")
	require.Len(t, f.remediations(t, health.RemRunning), 0, "nothing starts while the breaker is open")
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'health.breaker_tripped'`))

	// The window passes: the breaker stays open until an operator resets it.
	f.cp.Clock.Advance(time.Hour)
	f.reconcile(t)
	require.Equal(t, health.BreakerOpen, poolStatus(t, f.db, f.poolID, f.cp.Clock.Now()).Breaker.State)
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := f.hm.ResetBreaker(ctx, tx, f.poolID, "", "test:operator", "driver rolled back")
		return err
	}))
	f.reconcile(t)
	require.Len(t, f.remediations(t, health.RemRunning), 2, "after the reset the drained nodes' workflows start, within the budget")
	require.Len(t, f.remediations(t, health.RemPending), 3)
}

func TestRemediationLifecycle(t *testing.T) {
	// Twenty nodes: two unhealthy at once stay under the breaker's limit.
	f := newFleet(t, 20, &apiv1.PoolPolicy{OnNodeLost: "replace"})
	ctx := context.Background()
	engine := f.cp.App.Metal.Engine
	run := func(t *testing.T, fail bool) health.Remediation {
		t.Helper()
		f.reconcile(t)
		f.ackDrains(t)
		f.reconcile(t)
		rs := f.remediations(t, health.RemRunning)
		require.Len(t, rs, 1)
		require.NoError(t, engine.Reconcile(ctx, rs[0].WorkflowID))
		require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM commands WHERE node_id = $1 AND kind = $2 AND signature IS NOT NULL`,
			rs[0].NodeID, map[string]string{"reset": health.KindGPUReset, "reboot": health.KindNodeReboot}[rs[0].Action]),
			"the step goes to the node as a signed command")
		require.NoError(t, finishStep(ctx, f.db, engine, rs[0], fail))
		return rs[0]
	}

	t.Run("a reset that works lifts the GPU and undrains the node", func(t *testing.T) {
		n, g := f.nodeIDs[0], f.gpusOf[f.nodeIDs[0]][2]
		f.xid(t, n, g, 63)
		r := run(t, false)
		require.Equal(t, health.RemSucceeded, f.remediations(t, health.RemSucceeded)[0].State)
		require.Equal(t, r.ID, f.remediations(t, health.RemSucceeded)[0].ID)
		require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM health_gpus WHERE gpu_uuid = $1`, g))
		require.Equal(t, "active", nodeState(t, f, n))
		require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM health_findings WHERE node_id = $1 AND state = 'open'`, n))

		// The same GPU again within the day: no second reset, the node
		// goes to an operator.
		f.xid(t, n, g, 63)
		require.Len(t, f.remediations(t, health.RemPending), 0)
		require.Equal(t, "draining", nodeState(t, f, n))
		require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM node_conditions WHERE node_id = $1 AND type = 'Maintenance' AND status = 'true'`, n))
	})

	t.Run("a reboot that fails escalates the node to maintenance", func(t *testing.T) {
		n := f.nodeIDs[1]
		f.xid(t, n, f.gpusOf[n][0], 79)
		r := run(t, true)
		got := f.remediations(t, health.RemEscalated)
		require.Len(t, got, 1)
		require.Equal(t, r.ID, got[0].ID)
		require.Contains(t, got[0].Error, "failed")
		require.Equal(t, "drained", nodeState(t, f, n), "the node stays out")
		require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM node_conditions WHERE node_id = $1 AND type = 'Maintenance' AND status = 'true'`, n))
		require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM health_gpus WHERE gpu_uuid = $1`, f.gpusOf[n][0]), "the GPU stays quarantined")
	})
}

func TestReservationsOnABadGPU(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy *apiv1.PoolPolicy
		moved  bool
	}{
		{"moved where the pool replaces", &apiv1.PoolPolicy{OnNodeLost: "replace"}, true},
		{"kept where the pool releases", &apiv1.PoolPolicy{OnNodeLost: "release"}, false},
		{"kept where the policy says so", &apiv1.PoolPolicy{OnNodeLost: "replace", Health: &apiv1.HealthPolicy{KeepReservations: true}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, 2, tc.policy)
			ctx := context.Background()
			res, err := f.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100",
				Gpus: 1, Binding: "none", DurationSeconds: 3600}))
			require.NoError(t, err)
			rid := res.Msg.GetReservation().GetId()
			var node, gpu string
			require.NoError(t, f.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
				return tx.QueryRow(ctx, `SELECT a.node_id, a.gpu_uuid FROM bookings b JOIN atoms a ON a.id = b.atom
					WHERE b.reservation_id = $1 AND a.kind = 'gpu'`, rid).Scan(&node, &gpu)
			}))
			f.xid(t, node, gpu, 48)
			r, err := f.admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: rid}))
			require.NoError(t, err)
			var cond *apiv1.ReservationCondition
			for _, c := range r.Msg.GetReservation().GetConditions() {
				if c.GetType() == "GpuUnhealthy" {
					cond = c
				}
			}
			require.NotNil(t, cond, "the reservation is told")
			require.Contains(t, cond.GetMessage(), gpu)
			require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'reservation.gpu_unhealthy' AND resource_id = $1`, rid))
			onBad := f.count(t, `SELECT COUNT(*) FROM bookings b JOIN atoms a ON a.id = b.atom WHERE b.reservation_id = $1 AND a.gpu_uuid = $2`, rid, gpu)
			if tc.moved {
				require.Zero(t, onBad, "the reservation left the bad GPU")
				require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'reservation.requeued' AND resource_id = $1`, rid))
			} else {
				require.Equal(t, 1, onBad, "the reservation keeps its GPU until it ends")
			}
		})
	}
}

func TestHealthPolicyValidation(t *testing.T) {
	f := newFleet(t, 1, nil)
	for _, tc := range []struct {
		policy *apiv1.PoolPolicy
		field  string
	}{
		{&apiv1.PoolPolicy{Health: &apiv1.HealthPolicy{XidActions: map[int64]string{79: "explode"}}}, "policy.health.xid_actions[79]"},
		{&apiv1.PoolPolicy{Health: &apiv1.HealthPolicy{XidActions: map[int64]string{0: "record"}}}, "policy.health.xid_actions[0]"},
		{&apiv1.PoolPolicy{Health: &apiv1.HealthPolicy{DisruptionBudgetPercent: 101}}, "policy.health.disruption_budget_percent"},
		{&apiv1.PoolPolicy{Health: &apiv1.HealthPolicy{BreakerPercent: -1}}, "policy.health.breaker_percent"},
		{&apiv1.PoolPolicy{Health: &apiv1.HealthPolicy{BreakerWindowSeconds: 86401}}, "policy.health.breaker_window_seconds"},
		{&apiv1.PoolPolicy{Mig: "auto"}, "policy.mig"},
		{&apiv1.PoolPolicy{Mig: "sometimes", GpuSharing: "mig"}, "policy.mig"},
	} {
		_, err := f.admin.Pools.Create(context.Background(), connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "bad", Policy: tc.policy}))
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), tc.field)
		require.Contains(t, err.Error(), tc.field)
		require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM pools WHERE name = 'bad'`), "nothing written")
	}
}

func TestEventSentAgainOnANewSession(t *testing.T) {
	f := newFleet(t, 1, nil)
	n := f.nodeIDs[0]
	ev := &agentv1.HealthEvent{Kind: "gpu.xid", Device: f.gpusOf[n][0], Code: 63, Message: "held", Time: timestamppb.New(time.Now())}
	f.report(t, n, []*agentv1.HealthEvent{ev}, nil, false)
	f.report(t, n, []*agentv1.HealthEvent{ev}, nil, true) // the next session's opening report
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM health_findings WHERE node_id = $1`, n), "one XID, one finding")
	require.Len(t, f.remediations(t, health.RemPending), 1)
	ev2 := &agentv1.HealthEvent{Kind: "gpu.xid", Device: f.gpusOf[n][0], Code: 63, Message: "again", Time: timestamppb.New(time.Now().Add(time.Second))}
	f.report(t, n, []*agentv1.HealthEvent{ev2}, nil, false)
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM health_findings WHERE node_id = $1`, n), "a second XID is a second finding")
}
