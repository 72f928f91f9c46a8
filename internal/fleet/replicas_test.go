package fleet_test

import (
	"context"
	"testing"
	"time"

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

// TestGatewayReplicaPrune: a replica's row goes once it has not been
// touched for the bound, unless a node's session still names the replica;
// a touch (GatewayReplicaSet again) keeps it.
func TestGatewayReplicaPrune(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	db := f.cp.App.DB
	write := func(fn func(ctx context.Context, tx store.Tx) error) {
		t.Helper()
		require.NoError(t, db.Write(ctx, fn))
	}
	set := func(id string) {
		t.Helper()
		write(func(ctx context.Context, tx store.Tx) error {
			return fleet.GatewayReplicaSet(ctx, tx, id, "https://"+id+":9443")
		})
	}
	// prune prunes and checks it says how many rows went (the control
	// plane's own replica may have one too, on PostgreSQL).
	prune := func() {
		t.Helper()
		var before, after, n int64
		write(func(ctx context.Context, tx store.Tx) (err error) {
			if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM gateway_replicas`).Scan(&before); err != nil {
				return err
			}
			if n, err = fleet.GatewayReplicaPrune(ctx, tx, 10*time.Minute); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM gateway_replicas`).Scan(&after)
		})
		require.Equal(t, before-after, n)
	}
	rows := func() []string {
		t.Helper()
		var ids []string
		require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			rs, err := tx.Query(ctx, `SELECT id FROM gateway_replicas WHERE id LIKE 'rep-%' ORDER BY id`)
			if err != nil {
				return err
			}
			defer rs.Close()
			for rs.Next() {
				var id string
				if err := rs.Scan(&id); err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return rs.Err()
		}))
		return ids
	}

	set("rep-gone")
	set("rep-live")
	set("rep-owner")
	write(func(ctx context.Context, tx store.Tx) error {
		_, err := fleet.NodeRecordHello(ctx, tx, &fleet.NodeHelloParams{NodeID: f.node.ID, Owner: "rep-owner", Mode: "node"})
		return err
	})
	f.cp.Clock.Advance(9 * time.Minute)
	prune()
	require.Equal(t, []string{"rep-gone", "rep-live", "rep-owner"}, rows(), "nothing stale yet")
	set("rep-live") // its periodic touch
	f.cp.Clock.Advance(2 * time.Minute)
	prune()
	require.Equal(t, []string{"rep-live", "rep-owner"}, rows(), "the stale row whose replica holds a session stays")

	write(func(ctx context.Context, tx store.Tx) error {
		return fleet.NodeReleaseSession(ctx, tx, f.node.ID, "rep-owner")
	})
	prune()
	require.Equal(t, []string{"rep-live"}, rows())
	f.cp.Clock.Advance(10*time.Minute + time.Second)
	prune()
	require.Empty(t, rows())
}
