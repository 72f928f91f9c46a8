package reservation_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/store"
)

// TestArchiveBookings: the archive job moves bookings that ended more than
// ArchiveAfter ago out of the live tables, and leaves live ones alone.
func TestArchiveBookings(t *testing.T) {
	t.Parallel()
	e := setupTorture(t, 1)
	ctx := context.Background()
	create := func() string {
		res, err := e.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: "acme", Project: "default", Pool: "main", Gpus: 1, Vcpu: 2, DurationSeconds: 3600, Binding: reservation.BindingNone}))
		require.NoError(t, err)
		return res.Msg.GetReservation().GetId()
	}
	count := func(table, id string) (n int) {
		require.NoError(t, e.write(func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM `+table+` WHERE reservation_id = $1`, id).Scan(&n)
		}))
		return n
	}
	old := create()
	e.cp.Clock.Advance(10 * time.Minute) // used a while: its bookings end, not vanish
	_, err := e.admin.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: old}))
	require.NoError(t, err)
	require.Positive(t, count("bookings", old))
	require.Positive(t, count("cpu_bookings", old))
	e.cp.Clock.Advance(reservation.ArchiveAfter + time.Hour)
	live := create()

	n, err := e.cp.App.Capacity.ArchiveBookings(ctx)
	require.NoError(t, err)
	require.Positive(t, n)
	require.Zero(t, count("bookings", old))
	require.Zero(t, count("cpu_bookings", old))
	require.Positive(t, count("bookings_archive", old))
	require.Positive(t, count("cpu_bookings_archive", old))
	require.Positive(t, count("bookings", live), "a live booking stays")
	again, err := e.cp.App.Capacity.ArchiveBookings(ctx)
	require.NoError(t, err)
	require.Zero(t, again, "archiving twice moves nothing more")
}
