package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/store"
)

// BenchmarkInsertRows writes 2,000 rows of five values with one InsertRows
// call, as a placer batch writes its bookings. On SQLite the statement size
// decides it: binding costs the square of a statement's parameters.
func BenchmarkInsertRows(b *testing.B) {
	db := bctest.NewDB(b, clock.Real{})
	ctx := context.Background()
	if err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE bench_rows (a TEXT, b TEXT, c TEXT, d INTEGER, e INTEGER)`)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	rows := make([][]any, 2000)
	for i := range rows {
		rows[i] = []any{fmt.Sprintf("rsv_%d", i), "atom", "x", i, i}
	}
	for b.Loop() {
		if err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			if err := store.InsertRows(ctx, tx, `INSERT INTO bench_rows (a, b, c, d, e)`, "", rows); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `DELETE FROM bench_rows`)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
}
