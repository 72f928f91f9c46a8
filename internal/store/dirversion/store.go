package dirversion

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// counter is the directory's row of store_versions.
const counter = "directory"

// Read returns the directory version q sees: 0 before the first Bump.
func Read(ctx context.Context, q store.Querier) (int64, error) {
	var v int64
	err := q.QueryRow(ctx, `SELECT COALESCE((SELECT version FROM store_versions WHERE name = $1), 0)`, counter).Scan(&v)
	return v, err
}

// Bump moves the directory version on inside tx. Every write to api_keys,
// tenants, projects, pools or pool_offers calls it in its own transaction,
// before it changes the row, so that the counter is the first directory lock
// a writer takes. On PostgreSQL the row stays locked until tx ends: writers
// of the directory take turns, and versions follow commit order.
func Bump(ctx context.Context, tx store.Tx) error {
	_, err := tx.Exec(ctx, `INSERT INTO store_versions (name, version) VALUES ($1, 1)
		ON CONFLICT (name) DO UPDATE SET version = store_versions.version + 1`, counter)
	return err
}
