package dirversion_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/dirversion"
)

func read(t *testing.T, db *store.DB) int64 {
	t.Helper()
	var v int64
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		v, err = dirversion.Read(ctx, tx)
		return err
	}))
	return v
}

func bump(t *testing.T, db *store.DB) {
	t.Helper()
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return dirversion.Bump(ctx, tx)
	}))
}

// TestBumpCommitsWithItsTransaction: the version moves when the writer's
// transaction commits, and not when it rolls back, and a second handle to
// the database (another replica) sees it.
func TestBumpCommitsWithItsTransaction(t *testing.T) {
	t.Parallel()
	cfg := bctest.NewStoreConfig(t, nil)
	db, other := bctest.OpenDB(t, cfg), bctest.OpenDB(t, cfg)
	require.Equal(t, int64(0), read(t, db), "no write yet")
	bump(t, db)
	bump(t, db)
	require.Equal(t, int64(2), read(t, other))
	errAbort := errors.New("abort")
	err := db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		if err := dirversion.Bump(ctx, tx); err != nil {
			return err
		}
		return errAbort
	})
	require.ErrorIs(t, err, errAbort)
	require.Equal(t, int64(2), read(t, other), "a rolled-back bump moves nothing")
}

var things = dirversion.NewCache[string, string]("test.things", 2)

// TestCacheAnswersAtOneVersion: a cache answers only for a request that
// carries a version, only with entries made at that version, and drops them
// all when a request carries another.
func TestCacheAnswersAtOneVersion(t *testing.T) {
	t.Parallel()
	db := bctest.NewDB(t, nil)
	dir := dirversion.New(db)
	ctx := context.Background()

	things.Put(ctx, "a", "1")
	_, ok := things.Get(ctx, "a")
	require.False(t, ok, "without a version nothing is kept or answered")
	require.Equal(t, dirversion.Stats{}, dir.Stats("test.things"))

	v0, err := dir.Begin(ctx)
	require.NoError(t, err)
	_, ok = things.Get(v0, "a")
	require.False(t, ok)
	things.Put(v0, "a", "1")
	got, ok := things.Get(v0, "a")
	require.True(t, ok)
	require.Equal(t, "1", got)
	again, err := dir.Begin(ctx)
	require.NoError(t, err)
	_, ok = things.Get(again, "a")
	require.True(t, ok, "a later request at the same version hits")
	require.Equal(t, dirversion.Stats{Hits: 2, Misses: 1}, dir.Stats("test.things"))

	// Another directory (another replica) has entries of its own.
	elsewhere, err := dirversion.New(db).Begin(ctx)
	require.NoError(t, err)
	_, ok = things.Get(elsewhere, "a")
	require.False(t, ok)

	bump(t, db)
	v1, err := dir.Begin(ctx)
	require.NoError(t, err)
	_, ok = things.Get(v1, "a")
	require.False(t, ok, "a new version drops what the old one cached")
	things.Put(v1, "a", "2")
	_, ok = things.Get(v0, "a")
	require.False(t, ok, "a request of the old version does not see the new entry")
	_, ok = things.Get(v1, "a")
	require.False(t, ok, "nor does it leave its version's entries to the new one")

	// The bound: past max entries the kind starts over.
	things.Put(v1, "a", "2")
	things.Put(v1, "b", "2")
	things.Put(v1, "c", "2")
	_, ok = things.Get(v1, "a")
	require.False(t, ok)
	_, ok = things.Get(v1, "c")
	require.True(t, ok)
}
