package placer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/store"
)

// rowsOf lists a scratch table's rows in insertion order.
func rowsOf(ctx context.Context, t *testing.T, tx store.Tx, table string) []string {
	t.Helper()
	rows, err := tx.Query(ctx, `SELECT id FROM `+table+` ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		out = append(out, id)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestStageByHead: rows staged under several INSERT heads, interleaved, are
// written per head in the order staged; an item rewound to its mark leaves
// none of its rows; and a batch outside a placer writes a row as it is
// staged.
func TestStageByHead(t *testing.T) {
	t.Parallel()
	db := bctest.NewDB(t, nil)
	ctx := context.Background()
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		for _, table := range []string{"scratch_a", "scratch_b"} {
			if _, err := tx.Exec(ctx, `CREATE TABLE `+table+` (id TEXT PRIMARY KEY, seq INTEGER NOT NULL)`); err != nil {
				return err
			}
		}
		return nil
	}))
	const headA, headB = `INSERT INTO scratch_a (id, seq)`, `INSERT INTO scratch_b (id, seq)`

	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		b := placer.NewTestBatch(tx, false)
		require.NoError(t, b.Stage(ctx, headA, []any{"a1", 1}))
		require.NoError(t, b.Stage(ctx, headB, []any{"b1", 1}))
		require.NoError(t, b.Stage(ctx, headA, []any{"a2", 2}))
		m := b.Mark()
		require.NoError(t, b.Stage(ctx, headA, []any{"a3", 3}))
		require.NoError(t, b.Stage(ctx, headB, []any{"b2", 2}))
		require.Empty(t, rowsOf(ctx, t, tx, "scratch_a"), "a staging batch writes nothing before its flush")
		b.Rewind(m)
		require.NoError(t, b.Stage(ctx, headB, []any{"b3", 3}))
		require.NoError(t, b.Flush(ctx))
		require.Equal(t, []string{"a1", "a2"}, rowsOf(ctx, t, tx, "scratch_a"))
		require.Equal(t, []string{"b1", "b3"}, rowsOf(ctx, t, tx, "scratch_b"))
		require.NoError(t, b.Flush(ctx), "a second flush writes nothing again")
		return nil
	}))

	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		b := placer.NewTestBatch(tx, true)
		require.NoError(t, b.Stage(ctx, headA, []any{"a4", 4}))
		require.Equal(t, []string{"a1", "a2", "a4"}, rowsOf(ctx, t, tx, "scratch_a"), "outside a placer a row is written as staged")
		return nil
	}))
}
