package health_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// bmcRecorder is a BMC step runner that records what it is handed.
type bmcRecorder struct{ runs []provision.StepRun }

func (b *bmcRecorder) Dispatch(_ context.Context, run provision.StepRun) (provision.Dispatched, error) {
	b.runs = append(b.runs, run)
	return provision.Dispatched{Handle: "site-dispatch"}, nil
}

func (b *bmcRecorder) Lookup(_ context.Context, run provision.StepRun) (provision.Outcome, error) {
	b.runs = append(b.runs, run)
	return provision.Outcome{Status: provision.OutcomeRunning}, nil
}

func TestRebootThroughTheNodeOrItsBMC(t *testing.T) {
	f := newFleet(t, 2, nil)
	ctx := context.Background()
	bmc := &bmcRecorder{}
	r := &health.NodeCommands{DB: f.db, BMC: bmc, MachineOf: func(_ context.Context, _ store.Querier, nodeID string) (string, error) {
		if nodeID == f.nodeIDs[1] {
			return "mch_1", nil
		}
		return "", nil
	}}
	run := func(node, key string) provision.StepRun {
		return provision.StepRun{WorkflowID: "wfl_" + key, TargetID: node, TenantID: "t", Kind: health.KindNodeReboot, IdempotencyKey: key, Destructive: true}
	}
	setLiveness := func(node, l string) {
		require.NoError(t, f.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE nodes SET liveness = $2 WHERE id = $1`, node, l)
			return err
		}))
	}

	// A ready machine node reboots itself: a signed command, not the BMC.
	_, err := r.Dispatch(ctx, run(f.nodeIDs[1], "k1"))
	require.NoError(t, err)
	require.Empty(t, bmc.runs)
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM commands WHERE node_id = $1 AND kind = 'node.reboot'`, f.nodeIDs[1]))

	// An unreachable one is power-cycled by its machine's BMC, to its disk.
	setLiveness(f.nodeIDs[1], "unreachable")
	_, err = r.Dispatch(ctx, run(f.nodeIDs[1], "k2"))
	require.NoError(t, err)
	require.Len(t, bmc.runs, 1)
	require.Equal(t, "mch_1", bmc.runs[0].TargetID)
	require.Equal(t, health.KindPowerCycle, bmc.runs[0].Kind)
	require.Equal(t, "disk", bmc.runs[0].Params["boot"])
	require.Equal(t, "k2", bmc.runs[0].IdempotencyKey, "the same step key: its report completes the step")
	// Its lookup asks the BMC too, even once the node is back.
	setLiveness(f.nodeIDs[1], "ready")
	out, err := r.Lookup(ctx, run(f.nodeIDs[1], "k2"))
	require.NoError(t, err)
	require.Equal(t, provision.OutcomeRunning, out.Status)
	require.Len(t, bmc.runs, 2)

	// A node that is no machine's reboots itself, reachable or not.
	setLiveness(f.nodeIDs[0], "unreachable")
	_, err = r.Dispatch(ctx, run(f.nodeIDs[0], "k3"))
	require.NoError(t, err)
	require.Len(t, bmc.runs, 2)
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM commands WHERE node_id = $1 AND kind = 'node.reboot'`, f.nodeIDs[0]))
}
