package vps_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tunnel"
	"github.com/better-compute/better-compute/internal/vps"
)

// TestTicketStore: a ticket is kept under the hash of its id, redeemed
// once, and expired ones go when the next is issued.
func TestTicketStore(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	db := f.cp.App.DB
	now := f.cp.Clock.Now()
	tk := tunnel.Ticket{TenantID: "tnt_a", InstanceID: "ins_1", HostID: "ins-1", NodeID: "nod_1", Expire: now.Add(tunnel.TicketTTL).Truncate(time.Second)}
	insert := func(id string, t tunnel.Ticket, now time.Time) error {
		return db.Write(ctx, func(ctx context.Context, tx store.Tx) error { return vps.TicketInsert(ctx, tx, id, t, now) })
	}
	redeem := func(id string) (got tunnel.Ticket, err error) {
		err = db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			got, err = vps.TicketRedeem(ctx, tx, id)
			return err
		})
		return got, err
	}
	id, err := tunnel.NewID()
	require.NoError(t, err)
	require.NoError(t, insert(id, tk, now))
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM ssh_tickets WHERE id_hash = $1`, id), "the id itself is not stored")

	got, err := redeem(id)
	require.NoError(t, err)
	require.Equal(t, tk.NodeID, got.NodeID)
	require.Equal(t, tk.HostID, got.HostID)
	require.True(t, tk.Expire.Equal(got.Expire))
	_, err = redeem(id)
	require.ErrorIs(t, err, store.ErrNotFound, "a second use")
	_, err = redeem("unknown")
	require.ErrorIs(t, err, store.ErrNotFound)

	// An expired ticket goes with the next issue.
	old, err := tunnel.NewID()
	require.NoError(t, err)
	require.NoError(t, insert(old, tk, now))
	fresh, err := tunnel.NewID()
	require.NoError(t, err)
	later := tk
	later.Expire = tk.Expire.Add(time.Hour)
	require.NoError(t, insert(fresh, later, tk.Expire))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM ssh_tickets`))
	_, err = redeem(old)
	require.ErrorIs(t, err, store.ErrNotFound)
}
