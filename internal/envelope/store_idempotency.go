package envelope

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/better-compute/better-compute/internal/store"
)

// idempotencyInsert stores results for replay; a key another request stored
// first fails with errIdempotencyRace.
func idempotencyInsert(ctx context.Context, tx store.Tx, recs []idemRecord) error {
	if len(recs) == 0 {
		return nil
	}
	// An expired row for the same key may still be there until the pruner
	// runs; it no longer counts.
	rows := make([][]any, len(recs))
	var where strings.Builder
	args := make([]any, 0, 2*len(recs))
	for i, r := range recs {
		rows[i] = []any{r.principalID, r.key, r.procedure, r.reqHash, r.body, store.Raw("compute_now()"), r.expire}
		if i > 0 {
			where.WriteString(" OR ")
		}
		fmt.Fprintf(&where, "(principal_id = $%d AND key = $%d)", 2*i+1, 2*i+2)
		args = append(args, r.principalID, r.key)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE expire_time <= compute_now() AND (`+where.String()+`)`, args...); err != nil {
		return err
	}
	err := store.InsertRows(ctx, tx, `INSERT INTO idempotency_keys (principal_id, key, procedure, request_hash, response, create_time, expire_time)`, "", rows)
	if errors.Is(err, store.ErrUnique) {
		return errIdempotencyRace
	}
	return err
}

// PruneIdempotencyKeys deletes expired keys; a periodic job calls it.
func PruneIdempotencyKeys(ctx context.Context, db *store.DB) (int64, error) {
	var n int64
	err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		n, err = tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE expire_time <= compute_now()`)
		return err
	})
	return n, err
}

// idempotencyGet reads a live idempotency record: procedure, request hash,
// response.
func idempotencyGet(ctx context.Context, q store.Querier, principalID, key string) store.Row {
	return q.QueryRow(ctx, `SELECT procedure, request_hash, response FROM idempotency_keys
		WHERE principal_id = $1 AND key = $2 AND expire_time > compute_now()`, principalID, key)
}
