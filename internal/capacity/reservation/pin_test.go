package reservation_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// bookInstance books ib in the pool's placer as the instance service does,
// and returns the reservation or the refusal.
func (f *fixture) bookInstance(t *testing.T, ib reservation.InstanceBooking) (*reservation.Reservation, error) {
	t.Helper()
	var r *reservation.Reservation
	err := f.cp.App.Capacity.Engine.SubmitInstance(context.Background(), ib.PoolID, ib.TenantID, func(ctx context.Context, b *envelope.Batch) error {
		var err error
		r, _, err = f.cp.App.Capacity.Engine.BookInstance(ctx, b.Tx, ib, time.Now())
		return err
	})
	return r, err
}

// TestBookInstancePinned: an instance booked with a NodeID lands on that
// node even where placement would rather put it elsewhere; when that node
// cannot hold it, now or ever, the refusal names the node and nothing is
// written. The pin is not stored with the reservation.
func TestBookInstancePinned(t *testing.T) {
	t.Parallel()
	f := setup(t, 2)
	ctx := context.Background()
	type node struct{ id, name string }
	var nodes []node
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, name FROM nodes ORDER BY id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var n node
			if err := rows.Scan(&n.id, &n.name); err != nil {
				return err
			}
			nodes = append(nodes, n)
		}
		return rows.Err()
	}))
	require.Len(t, nodes, 2)
	guest := reservation.InstanceBooking{TenantID: f.acme, PoolID: f.pool, VCPU: 1, MemoryGiB: 1, Flavor: "small", CreatedBy: "test"}

	// Unpinned, the first guest goes where placement likes; binpacking
	// then prefers that node for the next one, so the pin decides.
	first, err := f.bookInstance(t, guest)
	require.NoError(t, err)
	other := nodes[0]
	if first.NodeID == other.id {
		other = nodes[1]
	}
	pinned := guest
	pinned.NodeID = other.id
	r, err := f.bookInstance(t, pinned)
	require.NoError(t, err)
	require.Equal(t, other.id, r.NodeID)
	require.Equal(t, reservation.StateActive, r.State)
	var again reservation.Reservation
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		again, err = reservation.GetInstanceReservation(ctx, tx, r.ID)
		return err
	}))
	require.Equal(t, other.id, again.NodeID)
	require.Empty(t, again.PinNodeID, "the pin steers the first placement only; it is not stored")
	// Without the pin the next guest would join the first.
	r, err = f.bookInstance(t, guest)
	require.NoError(t, err)
	require.Equal(t, first.NodeID, r.NodeID)

	// The pinned node's vCPUs, all but the one guest's taken by another
	// pinned guest: the next one pinned there fits the node empty but not
	// now.
	var free int
	require.NoError(t, f.cp.App.Capacity.Engine.SubmitInstance(ctx, f.pool, f.acme, func(ctx context.Context, b *envelope.Batch) error {
		n := placer.BatchOf(ctx).Index().Static().Nodes[other.id]
		free = n.Host.VCPU - n.HostReserve.VCPU
		return nil
	}))
	require.Greater(t, free, 1)
	big := pinned
	big.VCPU = free - 1
	_, err = f.bookInstance(t, big)
	require.NoError(t, err)
	before := f.written(t)
	_, err = f.bookInstance(t, pinned)
	requireRefused(t, err, envelope.CodeNoCapacity, 0)
	require.Contains(t, err.Error(), "node "+other.name+" (where the request is pinned) cannot hold the guest now (instances do not queue)")
	require.Contains(t, err.Error(), "1 node: not enough free vcpu")
	require.NotContains(t, err.Error(), placement.ReasonPinned, "the message says the pinned node's reason only")
	var apiErr *envelope.Error
	require.True(t, errors.As(err, &apiErr))
	require.Contains(t, apiErr.Explanation.GetSummary(), "1 node: "+placement.ReasonPinned, "the explanation still counts the other node")
	require.Equal(t, before, f.written(t), "nothing written for a refused guest")

	// Never: more vCPUs than the pinned node has, though the pool's other
	// node is no larger; and a node that is not in the pool.
	huge := pinned
	huge.VCPU = free + 1
	_, err = f.bookInstance(t, huge)
	requireRefused(t, err, envelope.CodeNoCapacity, connect.CodeFailedPrecondition)
	require.Contains(t, err.Error(), "node "+other.name+" (where the request is pinned) offers ")
	require.Contains(t, err.Error(), " vCPUs, asked ")
	// A template's check says the same without booking.
	err = f.cp.App.Capacity.Engine.SubmitInstance(ctx, f.pool, f.acme, func(ctx context.Context, _ *envelope.Batch) error {
		return f.cp.App.Capacity.Engine.CheckInstanceFits(ctx, huge)
	})
	requireRefused(t, err, envelope.CodeNoCapacity, connect.CodeFailedPrecondition)
	require.Contains(t, err.Error(), "node "+other.name+" (where the request is pinned) offers ")
	gone := pinned
	gone.NodeID = "node-not-in-the-pool"
	_, err = f.bookInstance(t, gone)
	requireRefused(t, err, envelope.CodeNoCapacity, connect.CodeFailedPrecondition)
	require.Contains(t, err.Error(), "node node-not-in-the-pool (where the request is pinned) is not in the pool")
	require.Equal(t, before, f.written(t), "nothing written for refused guests")
}

// requireRefused checks err is the API error of that machine code and,
// unless status is 0, that connect status.
func requireRefused(t *testing.T, err error, code envelope.Code, status connect.Code) {
	t.Helper()
	var apiErr *envelope.Error
	require.True(t, errors.As(err, &apiErr), "an API error: %v", err)
	require.Equal(t, code, apiErr.Code, "%v", err)
	if status != 0 {
		require.Equal(t, status, apiErr.Status, "%v", err)
	}
}
