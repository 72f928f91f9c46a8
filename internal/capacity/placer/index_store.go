package placer

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/booking"
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
func poolBookings(ctx context.Context, q store.Querier, poolID string, now time.Time, fn func(atom string, sp span),
	cpu func(node string, cpu int, sp span)) error {
	devs, cpus, err := booking.Current(ctx, q, poolID, now)
	if err != nil {
		return err
	}
	for _, b := range devs {
		fn(b.Atom, span{start: b.StartsAt, end: b.EndsAt, rsv: b.ReservationID})
	}
	// The index keeps a span per CPU: placement picks CPUs one by one.
	for _, r := range cpus {
		for c := r.Lo; c < r.Hi; c++ {
			cpu(r.NodeID, c, span{start: r.StartsAt, end: r.EndsAt, rsv: r.ReservationID})
		}
	}
	return nil
}

// poolHolds calls fn with each holding reservation on the pool's nodes that
// ends after now.
func poolHolds(ctx context.Context, q store.Querier, poolID string, now time.Time, fn func(node string, h hold)) error {
	rows, err := q.Query(ctx, `SELECT r.id, r.node_id, r.tenant_id, r.starts_at, r.ends_at, r.memory_gib, r.hugepages_1gi, r.gpus + r.slots
		FROM reservations r JOIN node_pools np ON np.node_id = r.node_id
		WHERE np.pool_id = $1 AND r.state IN ('placed', 'binding', 'active', 'releasing') AND r.ends_at > $2`, poolID, now)
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

// nodeBookings reads a node's bookings that end after now: by GPU atom, and
// by CPU.
func nodeBookings(ctx context.Context, q store.Querier, nodeID string, now time.Time) (map[string][]span, map[int][]span, error) {
	booked := map[string][]span{}
	cpus := map[int][]span{}
	rows, err := q.Query(ctx, `SELECT b.atom, b.reservation_id, b.starts_at, b.ends_at FROM bookings b JOIN atoms a ON a.id = b.atom
			WHERE a.node_id = $1 AND b.ends_at > $2`, nodeID, now)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var a string
		var sp span
		if err := rows.Scan(&a, &sp.rsv, &sp.start, &sp.end); err != nil {
			return nil, nil, err
		}
		booked[a] = append(booked[a], sp)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	rows.Close()
	cpuRows, err := q.Query(ctx, `SELECT reservation_id, cpu_lo, cpu_hi, starts_at, ends_at FROM cpu_bookings
		WHERE node_id = $1 AND ends_at > $2`, nodeID, now)
	if err != nil {
		return nil, nil, err
	}
	defer cpuRows.Close()
	for cpuRows.Next() {
		var lo, hi int
		var sp span
		if err := cpuRows.Scan(&sp.rsv, &lo, &hi, &sp.start, &sp.end); err != nil {
			return nil, nil, err
		}
		for c := lo; c < hi; c++ {
			cpus[c] = append(cpus[c], sp)
		}
	}
	return booked, cpus, cpuRows.Err()
}

// nodeHolds reads a node's holding reservations that end after now.
func nodeHolds(ctx context.Context, q store.Querier, nodeID string, now time.Time) ([]hold, error) {
	var holds []hold
	rows, err := q.Query(ctx, `SELECT id, tenant_id, starts_at, ends_at, memory_gib, hugepages_1gi, gpus + slots FROM reservations
			WHERE node_id = $1 AND state IN ('placed', 'binding', 'active', 'releasing') AND ends_at > $2`, nodeID, now)
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
