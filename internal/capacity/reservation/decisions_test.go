package reservation_test

import (
	"context"
	"os"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
)

// TestOneDecisionPerMutationInBatches: creates committed together in placer
// batches, and on PostgreSQL creates forwarded from a second replica to the
// pool's owner, are each decided exactly once — by the replica that runs
// them, never by the one that forwards.
func TestOneDecisionPerMutationInBatches(t *testing.T) {
	t.Parallel()
	e := setupTorture(t, 1)
	ctx := context.Background()
	replicas := []*bctest.ControlPlane{e.cp}
	if os.Getenv(bctest.PostgresURLEnv) != "" {
		replicas = append(replicas, e.cp.NewReplica(t))
	}
	for _, cp := range replicas {
		cp.Authz.Reset()
	}
	const n = 24
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cp := replicas[i%len(replicas)]
			_, err := cp.Admin().Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
				Tenant: "acme", Project: "default", Pool: "main", Gpus: 1, DurationSeconds: 600, Binding: reservation.BindingNone}))
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	total := 0
	for _, cp := range replicas {
		total += cp.Authz.CallsFor("reservations.create")
	}
	require.Equal(t, n, total, "one decision per create, batched or forwarded")
}

// TestOneDecisionPerArray: an array is decided once, by the replica that
// runs it; on PostgreSQL one asked of a second replica is forwarded to the
// pool's owner and still decided once, its members placed on distinct
// atoms.
func TestOneDecisionPerArray(t *testing.T) {
	t.Parallel()
	e := setupTorture(t, 1)
	ctx := context.Background()
	replicas := []*bctest.ControlPlane{e.cp}
	if os.Getenv(bctest.PostgresURLEnv) != "" {
		replicas = append(replicas, e.cp.NewReplica(t))
	}
	for _, cp := range replicas {
		// The owner first: the second replica then forwards.
		for _, c := range replicas {
			c.Authz.Reset()
		}
		res, err := cp.Admin().Reservations.CreateReservations(ctx, connect.NewRequest(&apiv1.CreateReservationsRequest{Count: 4,
			Template: &apiv1.CreateReservationRequest{Tenant: "acme", Project: "default", Pool: "main", Gpus: 1, DurationSeconds: 600,
				Binding: reservation.BindingNone}}))
		require.NoError(t, err)
		require.Len(t, res.Msg.GetReservations(), 4)
		atoms := map[string]bool{}
		for _, r := range res.Msg.GetReservations() {
			for _, a := range r.GetPlacement().GetAtoms() {
				require.False(t, atoms[a], "atom %s booked twice", a)
				atoms[a] = true
			}
		}
		total := 0
		for _, c := range replicas {
			total += c.Authz.Calls()
		}
		require.Equal(t, 1, total, "one decision for the array, forwarded or not")
	}
}
