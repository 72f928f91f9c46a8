package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/store"
)

// TestInsertRowsWritesEveryRow: whatever the number of rows (full
// statements, then powers of two), every row is written once with its own
// values, a Raw is written as SQL, and the tail follows the VALUES list.
func TestInsertRowsWritesEveryRow(t *testing.T) {
	db := bctest.NewDB(t, clock.Real{})
	ctx := context.Background()
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE rows_test (k TEXT PRIMARY KEY, a TEXT, b INTEGER, c INTEGER, t TIMESTAMP)`)
		return err
	}))
	for _, n := range []int{1, 2, 3, 7, 255, 256, 257, 1000, 1203} {
		rows := make([][]any, n)
		for i := range rows {
			// Another Raw keeps an INSERT; compute_now() alone is one COPY
			// can write (as the transaction's value) on PostgreSQL.
			var c any = store.Raw("42")
			if n%2 == 1 {
				c = 42
			}
			rows[i] = []any{fmt.Sprintf("%d/%d", n, i), fmt.Sprintf("v%d", i), i, c, store.Raw("compute_now()")}
		}
		require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			return store.InsertRows(ctx, tx, `INSERT INTO rows_test (k, a, b, c, t)`, "", rows)
		}), "n=%d", n)
		var count, sum, raw, times, timed int
		require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*), COALESCE(SUM(b), 0), COALESCE(MIN(c), 0), COUNT(DISTINCT t), COUNT(t)
				FROM rows_test WHERE k LIKE $1 AND a = 'v' || b`,
				fmt.Sprintf("%d/%%", n)).Scan(&count, &sum, &raw, &times, &timed)
		}))
		require.Equal(t, n, count, "n=%d", n)
		require.Equal(t, n*(n-1)/2, sum, "n=%d", n)
		require.Equal(t, 42, raw, "n=%d", n)
		require.Equal(t, n, timed, "n=%d: every row has its time", n)
		if db.Dialect() == store.Postgres && n >= 64 && n%2 == 1 {
			// By COPY: compute_now() read once and written as a value.
			require.Equal(t, 1, times, "n=%d: one COPY, one time", n)
		}
		_, isRaw := rows[0][4].(store.Raw)
		require.True(t, isRaw, "the caller's rows are not changed")
	}
	// A tail: a conflict clause keeps the first row.
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return store.InsertRows(ctx, tx, `INSERT INTO rows_test (k, a, b, c)`, `ON CONFLICT (k) DO NOTHING`,
			[][]any{{"1/0", "y", 5, 5}, {"tail", "y", 6, 6}})
	}))
	var a string
	var total int
	require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT a FROM rows_test WHERE k = '1/0'`).Scan(&a); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM rows_test WHERE a = 'y'`).Scan(&total)
	}))
	require.Equal(t, "v0", a)
	require.Equal(t, 1, total)
}
