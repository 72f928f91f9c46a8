package webhooks_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/webhooks"
)

// TestResealAndSealedAtRest: secrets are stored sealed, never in clear,
// and a reseal moves them to a new BETTER_COMPUTE_SECRET.
func TestResealAndSealedAtRest(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	wh, secret := f.create(t, "http://127.0.0.1:9/x", "webhook.never_emitted")
	var sealed []byte
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT secret FROM webhooks WHERE id = $1`, wh.GetId()).Scan(&sealed)
	}))
	require.NotContains(t, string(sealed), secret[len("whsec_"):], "sealed at rest")

	from, err := pki.NewSealer(f.cp.Secret)
	require.NoError(t, err)
	next, err := pki.GenerateSecret()
	require.NoError(t, err)
	to, err := pki.NewSealer(next)
	require.NoError(t, err)
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		n, err := webhooks.Reseal(ctx, tx, from, to)
		require.Equal(t, 1, n)
		return err
	}))
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT secret FROM webhooks WHERE id = $1`, wh.GetId()).Scan(&sealed)
	}))
	pt, err := to.Open("webhook/"+wh.GetId(), sealed)
	require.NoError(t, err)
	require.Equal(t, secret, string(pt))
	_, err = from.Open("webhook/"+wh.GetId(), sealed)
	require.Error(t, err, "the old secret no longer opens it")
}
