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
