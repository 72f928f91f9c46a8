package fleet_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// TestNodeStatusList: the nodes asked for come back by id, once each, and
// ids without a node are left out (capacity and vps pass ids from their
// own tables, which may name a node since deleted).
func TestNodeStatusList(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	n2 := f.insertNode(t, f.other.GetId(), "", "gpu-2.dc1", fleet.NodeDraining)
	want := []string{f.node.ID, n2.ID}
	if want[1] < want[0] {
		want[0], want[1] = want[1], want[0]
	}
	var got []fleet.NodeStatus
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		got, err = fleet.NodeStatusList(ctx, tx, []string{want[1], "nod_gone", want[0], want[1]})
		return err
	}))
	require.Len(t, got, 2)
	require.Equal(t, want, []string{got[0].ID, got[1].ID})
	byID := map[string]fleet.NodeStatus{got[0].ID: got[0], got[1].ID: got[1]}
	require.Equal(t, fleet.NodeDraining, byID[n2.ID].State)
	require.Equal(t, f.other.GetId(), byID[n2.ID].TenantID)
	require.Equal(t, "a100", byID[n2.ID].Pool)
	require.Equal(t, fleet.LivenessReady, byID[n2.ID].Liveness)

	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		got, err = fleet.NodeStatusList(ctx, tx, nil)
		return err
	}))
	require.Empty(t, got)
}

// TestNodeConditionUpdate changes a condition the node carries and never
// creates one.
func TestNodeConditionUpdate(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	db := f.cp.App.DB
	list := func() []fleet.NodeCondition {
		t.Helper()
		var conds map[string][]fleet.NodeCondition
		require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			conds, err = fleet.NodeConditionList(ctx, tx, f.node.ID)
			return err
		}))
		return conds[f.node.ID]
	}
	c := &fleet.NodeCondition{NodeID: f.node.ID, Type: "PoolConflict", Status: "false", Reason: "OnePool", Message: "m"}
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error { return fleet.NodeConditionUpdate(ctx, tx, c) }))
	require.Empty(t, list(), "no condition to update: none created")

	c.Status, c.Reason = "true", "SelectorsOverlap"
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error { return fleet.NodeConditionSet(ctx, tx, c) }))
	c.Status, c.Reason = "false", "OnePool"
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error { return fleet.NodeConditionUpdate(ctx, tx, c) }))
	conds := list()
	require.Len(t, conds, 1)
	require.Equal(t, "false", conds[0].Status)
	require.Equal(t, "OnePool", conds[0].Reason)
}
