package placer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/store"
)

// Savepoint runs fn under the named savepoint: an error rolls back fn's
// writes only, leaving the transaction usable.
func Savepoint(ctx context.Context, tx store.Tx, name string, fn func() error) error {
	if _, err := tx.Exec(ctx, `SAVEPOINT `+name); err != nil {
		return err
	}
	if err := fn(); err != nil {
		if _, rerr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT `+name); rerr != nil {
			return errors.Join(err, rerr)
		}
		_, rerr := tx.Exec(ctx, `RELEASE SAVEPOINT `+name)
		return errors.Join(err, rerr)
	}
	_, err := tx.Exec(ctx, `RELEASE SAVEPOINT `+name)
	return err
}

// atomsUsable reports whether the atoms are still the node's, in the pool,
// and neither quarantined nor frozen.
func atomsUsable(ctx context.Context, tx store.Tx, poolID, nodeID string, atoms []string) (bool, error) {
	if len(atoms) == 0 {
		return true, nil
	}
	atoms = slices.Compact(slices.Sorted(slices.Values(atoms)))
	args := []any{poolID, false}
	ph := make([]string, len(atoms))
	for i, a := range atoms {
		args = append(args, a)
		ph[i] = fmt.Sprintf("$%d", i+3)
	}
	// Looked up by id (the primary key), whatever the node: a batch checks
	// atoms of many nodes at once, and a condition on the node would steer
	// the planner off the key.
	query := `SELECT COUNT(*) FROM atoms a WHERE a.id IN (` + strings.Join(ph, ", ") + `) AND a.quarantined = $2 AND a.partition_pending = $2
		AND EXISTS (SELECT 1 FROM node_pools np WHERE np.node_id = a.node_id AND np.pool_id = $1)`
	if nodeID != "" {
		args = append(args, nodeID)
		query += fmt.Sprintf(" AND a.node_id = $%d", len(args))
	}
	var n int
	err := tx.QueryRow(ctx, query, args...).Scan(&n)
	return n == len(atoms), err
}

// checkHost takes the node's host row lock (PostgreSQL; SQLite has one
// writer) and refuses the booking when the memory of the reservations that
// overlap it, this one included, would exceed what the node hands out.
func checkHost(ctx context.Context, tx store.Tx, r *capmodel.Reservation, nodeID string) error {
	var mem, hp1 int
	if err := tx.QueryRow(ctx, `UPDATE host_resources SET version = version + 1 WHERE node_id = $1 RETURNING memory_gib, hugepages_1gi`, nodeID).
		Scan(&mem, &hp1); err != nil {
		return err
	}
	var usedMem, usedHP int
	if err := tx.QueryRow(ctx, `SELECT COALESCE(SUM(memory_gib), 0), COALESCE(SUM(hugepages_1gi), 0) FROM reservations
		WHERE node_id = $1 AND id <> $2 AND state IN ('placed', 'binding', 'active') AND starts_at < $4 AND ends_at > $3`,
		nodeID, r.ID, r.StartsAt, r.EndsAt).Scan(&usedMem, &usedHP); err != nil {
		return err
	}
	if usedMem+r.MemoryGiB > mem || usedHP+r.Hugepages1Gi > hp1 {
		return errHostFull
	}
	return nil
}

// nodeStateForShare reads a node's state and liveness, locking the row
// against a concurrent liveness sweep (FOR SHARE on PostgreSQL).
func nodeStateForShare(ctx context.Context, tx store.Tx, nodeID string) store.Row {
	return tx.QueryRow(ctx, `SELECT state, liveness FROM nodes WHERE id = $1`+store.ForShare(tx), nodeID)
}

// countPending counts a pool's pending reservations.
func countPending(ctx context.Context, tx store.Tx, poolID string) store.Row {
	return tx.QueryRow(ctx, `SELECT COUNT(*) FROM reservations WHERE pool_id = $1 AND state = 'pending'`, poolID)
}

// insertStaged writes staged rows, many to a statement per INSERT head, the
// heads in the order first staged.
func insertStaged(ctx context.Context, tx store.Tx, rows []stagedRow) error {
	var heads []string
	byHead := map[string][][]any{}
	for _, r := range rows {
		if _, ok := byHead[r.head]; !ok {
			heads = append(heads, r.head)
		}
		byHead[r.head] = append(byHead[r.head], r.row)
	}
	for _, h := range heads {
		if err := store.InsertRows(ctx, tx, h, "", byHead[h]); err != nil {
			return err
		}
	}
	return nil
}
