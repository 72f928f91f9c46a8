package reservation_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// TestPlacerRetriesASerializationFailure: a mutation in a pool's placer
// that loses a serialization race (a deadlock victim on PostgreSQL) is run
// again in a fresh transaction, not answered as the caller's conflict —
// CI once saw a release answered "concurrent update, retry".
func TestPlacerRetriesASerializationFailure(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	calls := 0
	err := f.cp.App.Capacity.Engine.SubmitInstance(context.Background(), f.pool, f.acme, func(ctx context.Context, b *envelope.Batch) error {
		calls++
		if calls == 1 {
			return envelope.FromStore(&store.Error{Kind: store.ErrSerialization}, "reservation")
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 2, calls, "run again after the failure")
}

// TestShortBatchLingersForMore: a placer with a short queue waits (up to
// its linger) for more work, so eight mutations sent together commit in one
// transaction; the linger ends as soon as the batch holds LingerBatch.
func TestShortBatchLingersForMore(t *testing.T) {
	t.Parallel()
	// An hour's linger: only the eighth mutation can end the first wait.
	f := setupWith(t, 1, bctest.FakeDaemonConfig{}, func(c *app.Config) { c.PlacerLinger = time.Hour })
	ctx := context.Background()
	// A pool of its own, so its placer has no hold measured yet.
	pl, err := f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "lingers",
		Selector: []*apiv1.SelectorRequirement{{Key: "zone", Operator: "In", Values: []string{"nowhere"}}}}))
	require.NoError(t, err)
	var mu sync.Mutex
	batches := map[*envelope.Batch]int{}
	var wg sync.WaitGroup
	for range placer.LingerBatch {
		wg.Go(func() {
			assert.NoError(t, f.cp.App.Capacity.Engine.SubmitInstance(ctx, pl.Msg.GetPool().GetId(), f.acme, func(ctx context.Context, b *envelope.Batch) error {
				mu.Lock()
				defer mu.Unlock()
				batches[b]++
				return nil
			}))
		})
	}
	wg.Wait()
	require.Len(t, batches, 1, "one transaction for all eight: %v", batches)
}
