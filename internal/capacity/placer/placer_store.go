package placer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

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

// hostCaps locks the host rows of nodes (PostgreSQL; SQLite has one writer)
// and reads what each hands out: memory GiB and 1 GiB hugepages.
func hostCaps(ctx context.Context, tx store.Tx, nodes []string) (map[string][2]int, error) {
	out := map[string][2]int{}
	if len(nodes) == 0 {
		return out, nil
	}
	nodes = slices.Compact(slices.Sorted(slices.Values(nodes)))
	args := make([]any, len(nodes))
	ph := make([]string, len(nodes))
	for i, n := range nodes {
		args[i] = n
		ph[i] = fmt.Sprintf("$%d", i+1)
	}
	rows, err := tx.Query(ctx, `UPDATE host_resources SET version = version + 1 WHERE node_id IN (`+strings.Join(ph, ", ")+`)
		RETURNING node_id, memory_gib, hugepages_1gi`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var c [2]int
		if err := rows.Scan(&id, &c[0], &c[1]); err != nil {
			return nil, err
		}
		out[id] = c
	}
	return out, rows.Err()
}

// hostHolds reads the holding reservations on nodes that overlap [from, to).
func hostHolds(ctx context.Context, tx store.Tx, nodes []string, from, to time.Time) ([]hostShare, error) {
	nodes = slices.Compact(slices.Sorted(slices.Values(nodes)))
	args := []any{from, to}
	ph := make([]string, len(nodes))
	for i, n := range nodes {
		args = append(args, n)
		ph[i] = fmt.Sprintf("$%d", i+3)
	}
	rows, err := tx.Query(ctx, `SELECT id, node_id, tenant_id, starts_at, ends_at, memory_gib, hugepages_1gi, gpus + slots FROM reservations
		WHERE node_id IN (`+strings.Join(ph, ", ")+`) AND state IN ('placed', 'binding', 'active', 'releasing') AND starts_at < $2 AND ends_at > $1`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []hostShare
	for rows.Next() {
		var h hostShare
		if err := rows.Scan(&h.rsv, &h.node, &h.tenant, &h.start, &h.end, &h.mem, &h.hp1, &h.atoms); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
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
