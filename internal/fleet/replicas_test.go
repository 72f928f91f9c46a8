package fleet_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// TestNodeSessionReplica: a node's session owner comes with the URL that
// replica recorded (the latest), none without a session, and an owner
// that recorded no URL comes without one.
func TestNodeSessionReplica(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	db := f.cp.App.DB
	read := func() (owner, url string) {
		t.Helper()
		require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			owner, url, err = fleet.NodeSessionReplica(ctx, tx, f.node.ID)
			return err
		}))
		return owner, url
	}
	write := func(fn func(ctx context.Context, tx store.Tx) error) {
		t.Helper()
		require.NoError(t, db.Write(ctx, fn))
	}
	write(func(ctx context.Context, tx store.Tx) error {
		return fleet.GatewayReplicaSet(ctx, tx, "rep-a", "https://10.0.0.1:9443")
	})
	write(func(ctx context.Context, tx store.Tx) error {
		return fleet.GatewayReplicaSet(ctx, tx, "rep-a", "https://10.0.0.9:9443")
	})
	write(func(ctx context.Context, tx store.Tx) error {
		_, err := fleet.NodeRecordHello(ctx, tx, &fleet.NodeHelloParams{NodeID: f.node.ID, Owner: "rep-a", Mode: "node"})
		return err
	})
	owner, url := read()
	require.Equal(t, "rep-a", owner)
	require.Equal(t, "https://10.0.0.9:9443", url, "the latest URL the replica recorded")

	write(func(ctx context.Context, tx store.Tx) error {
		_, err := fleet.NodeRecordHello(ctx, tx, &fleet.NodeHelloParams{NodeID: f.node.ID, Owner: "rep-b", Mode: "node"})
		return err
	})
	owner, url = read()
	require.Equal(t, "rep-b", owner)
	require.Empty(t, url, "rep-b recorded no URL")

	write(func(ctx context.Context, tx store.Tx) error {
		return fleet.NodeReleaseSession(ctx, tx, f.node.ID, "rep-b")
	})
	owner, url = read()
	require.Empty(t, owner)
	require.Empty(t, url)

	require.ErrorIs(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		_, _, err := fleet.NodeSessionReplica(ctx, tx, "nod_unknown")
		return err
	}), store.ErrNotFound)
}
