package pki

// SQL over the workload identity keys (workload.go).

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

type workloadKeyRow struct {
	KID        string
	KeySealed  []byte
	CreateTime time.Time
}

// workloadKeysNewest lists up to n keys, newest first.
func workloadKeysNewest(ctx context.Context, q store.Querier, n int) ([]workloadKeyRow, error) {
	rows, err := q.Query(ctx, `SELECT kid, key_sealed, create_time FROM pki_workload_keys
		ORDER BY seq DESC LIMIT $1`, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []workloadKeyRow
	for rows.Next() {
		var r workloadKeyRow
		if err := rows.Scan(&r.KID, &r.KeySealed, &r.CreateTime); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func workloadKeyInsert(ctx context.Context, tx store.Tx, r workloadKeyRow) error {
	// Two replicas rotating at once collide on seq: one fails and retries.
	_, err := tx.Exec(ctx, `INSERT INTO pki_workload_keys (kid, seq, key_sealed, create_time)
		VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM pki_workload_keys), $2, $3)`,
		r.KID, r.KeySealed, r.CreateTime)
	return err
}

func workloadKeyUpdate(ctx context.Context, tx store.Tx, kid string, sealed []byte) error {
	_, err := tx.Exec(ctx, `UPDATE pki_workload_keys SET key_sealed = $2 WHERE kid = $1`, kid, sealed)
	return err
}

// workloadKeysAll lists every key for a reseal.
func workloadKeysAll(ctx context.Context, q store.Querier) ([]workloadKeyRow, error) {
	return workloadKeysNewest(ctx, q, 1<<30)
}
