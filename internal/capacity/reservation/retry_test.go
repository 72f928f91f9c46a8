package reservation_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

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
