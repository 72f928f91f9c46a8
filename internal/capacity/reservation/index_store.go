package reservation

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// poolVersion reads the version the reconciler bumps when a pool's nodes or
// atoms change.
func poolVersion(ctx context.Context, q store.Querier, poolID string) (int64, error) {
	var v int64
	err := q.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM pool_versions WHERE pool_id = $1`, poolID).Scan(&v)
	return v, err
}

// poolBookings calls fn with each booking of the pool's atoms that ends
// after now.
func poolBookings(ctx context.Context, q store.Querier, poolID string, now time.Time, fn func(atom string, sp span)) error {
	rows, err := q.Query(ctx, `SELECT b.atom, b.reservation_id, b.starts_at, b.ends_at FROM bookings b
		JOIN atoms a ON a.id = b.atom JOIN node_pools np ON np.node_id = a.node_id
		WHERE np.pool_id = $1 AND b.ends_at > $2`, poolID, now)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var a, rsv string
		var sp span
		if err := rows.Scan(&a, &rsv, &sp.start, &sp.end); err != nil {
			return err
		}
		sp.rsv = rsv
		fn(a, sp)
	}
	return rows.Err()
}

// poolHolds calls fn with each holding reservation on the pool's nodes that
// ends after now.
func poolHolds(ctx context.Context, q store.Querier, poolID string, now time.Time, fn func(node string, h hold)) error {
	rows, err := q.Query(ctx, `SELECT r.id, r.node_id, r.tenant_id, r.starts_at, r.ends_at, r.memory_gib, r.hugepages_1gi, r.gpus + r.slots
		FROM reservations r JOIN node_pools np ON np.node_id = r.node_id
		WHERE np.pool_id = $1 AND r.state IN ('placed', 'binding', 'active') AND r.ends_at > $2`, poolID, now)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var h hold
		var node string
		if err := rows.Scan(&h.rsv, &node, &h.tenant, &h.start, &h.end, &h.mem, &h.hp1, &h.atoms); err != nil {
			return err
		}
		fn(node, h)
	}
	return rows.Err()
}

// nodeBookings reads a node's bookings that end after now, by atom.
func nodeBookings(ctx context.Context, q store.Querier, nodeID string, now time.Time) (map[string][]span, error) {
	booked := map[string][]span{}
	rows, err := q.Query(ctx, `SELECT b.atom, b.reservation_id, b.starts_at, b.ends_at FROM bookings b JOIN atoms a ON a.id = b.atom
			WHERE a.node_id = $1 AND b.ends_at > $2`, nodeID, now)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var a string
		var sp span
		if err := rows.Scan(&a, &sp.rsv, &sp.start, &sp.end); err != nil {
			return nil, err
		}
		booked[a] = append(booked[a], sp)
	}
	return booked, rows.Err()
}

// nodeHolds reads a node's holding reservations that end after now.
func nodeHolds(ctx context.Context, q store.Querier, nodeID string, now time.Time) ([]hold, error) {
	var holds []hold
	rows, err := q.Query(ctx, `SELECT id, tenant_id, starts_at, ends_at, memory_gib, hugepages_1gi, gpus + slots FROM reservations
			WHERE node_id = $1 AND state IN ('placed', 'binding', 'active') AND ends_at > $2`, nodeID, now)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var h hold
		if err := rows.Scan(&h.rsv, &h.tenant, &h.start, &h.end, &h.mem, &h.hp1, &h.atoms); err != nil {
			return nil, err
		}
		holds = append(holds, h)
	}
	return holds, rows.Err()
}
