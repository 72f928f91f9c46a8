package views

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// Atom kinds that have rollups. CPU atoms are booked like the others but
// capacity views count GPUs and their shares only.
const (
	KindGPU  = "gpu"
	KindMIG  = "mig"
	KindSlot = "slot"
)

// liveStates are the reservation states that hold their bookings; the
// rollups count an atom as booked while one of them holds it.
const liveStates = `('placed', 'binding', 'active', 'releasing')`

// rolledKinds is the SQL list of the kinds with rollups.
const rolledKinds = `('gpu', 'mig', 'slot')`

// Key names one rollup: a pool, a GPU model and an atom kind.
type Key struct {
	PoolID string
	Model  string
	Kind   string
}

// String renders the key as pool/model/kind, the form mismatches name it in.
func (k Key) String() string { return k.PoolID + "/" + k.Model + "/" + k.Kind }

// Counts are a rollup's values, in atoms.
type Counts struct {
	Total       int
	Booked      int
	Quarantined int
}

// Free is what is left to book: total - booked - quarantined, never
// negative (a quarantined atom may also be booked).
func (c Counts) Free() int { return max(0, c.Total-c.Booked-c.Quarantined) }

// IsZero reports whether every count is zero; such a rollup is the same as
// no rollup at all.
func (c Counts) IsZero() bool { return c == Counts{} }

func (c Counts) String() string {
	return fmt.Sprintf("total=%d booked=%d quarantined=%d", c.Total, c.Booked, c.Quarantined)
}

// Row is a stored rollup with the pool it belongs to. PoolName and TenantID
// are empty when the pool row is gone.
type Row struct {
	Key
	Counts
	PoolName string
	TenantID string
}

// Stored returns the stored rollups, the deltas summed by key, of the pools
// of one tenant or, with tenantID "", of every tenant. Keys whose sums are
// all zero are left out. Rows come ordered by tenant, pool name, pool id,
// model and kind.
func Stored(ctx context.Context, q store.Querier, tenantID string) ([]Row, error) {
	rows, err := q.Query(ctx, `SELECT d.pool_id, d.model, d.kind,
			COALESCE(SUM(d.total), 0), COALESCE(SUM(d.booked), 0), COALESCE(SUM(d.quarantined), 0),
			COALESCE(p.name, ''), COALESCE(p.tenant_id, '')
		FROM capacity_deltas d LEFT JOIN pools p ON p.id = d.pool_id
		WHERE $1 = '' OR p.tenant_id = $1
		GROUP BY d.pool_id, d.model, d.kind, p.name, p.tenant_id
		ORDER BY COALESCE(p.tenant_id, ''), COALESCE(p.name, ''), d.pool_id, d.model, d.kind`, tenantID)
	if err != nil {
		return nil, fmt.Errorf("read capacity rollups: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var (
			r                          Row
			total, booked, quarantined int64
		)
		if err := rows.Scan(&r.PoolID, &r.Model, &r.Kind, &total, &booked, &quarantined, &r.PoolName, &r.TenantID); err != nil {
			return nil, fmt.Errorf("read capacity rollups: %w", err)
		}
		r.Counts = Counts{Total: int(total), Booked: int(booked), Quarantined: int(quarantined)}
		if !r.IsZero() {
			out = append(out, r)
		}
	}
	return out, rows.Err()
}

// storedSums returns every stored rollup by key, all-zero ones left out.
func storedSums(ctx context.Context, q store.Querier) (map[Key]Counts, error) {
	out := map[Key]Counts{}
	err := scanCounts(ctx, q, out, func(c *Counts, total, booked, quarantined int64) {
		*c = Counts{Total: int(total), Booked: int(booked), Quarantined: int(quarantined)}
	}, `SELECT pool_id, model, kind, COALESCE(SUM(total), 0), COALESCE(SUM(booked), 0), COALESCE(SUM(quarantined), 0)
		FROM capacity_deltas GROUP BY pool_id, model, kind`)
	if err != nil {
		return nil, fmt.Errorf("read capacity rollups: %w", err)
	}
	dropZero(out)
	return out, nil
}

// scanCounts runs a query whose rows are (pool_id, model, kind, a, b, c) and
// merges each row into out with set.
func scanCounts(ctx context.Context, q store.Querier, out map[Key]Counts, set func(c *Counts, a, b, c2 int64), query string) error {
	rows, err := q.Query(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			k       Key
			a, b, c int64
		)
		if err := rows.Scan(&k.PoolID, &k.Model, &k.Kind, &a, &b, &c); err != nil {
			return err
		}
		cur := out[k]
		set(&cur, a, b, c)
		out[k] = cur
	}
	return rows.Err()
}

func dropZero(m map[Key]Counts) {
	for k, c := range m {
		if c.IsZero() {
			delete(m, k)
		}
	}
}

// Recompute derives every rollup from the rows it summarizes: atoms of the
// key on nodes whose membership names the pool (total, and quarantined for
// those quarantined or with a partition pending), and atoms of the key
// booked by the pool's placed, binding or active reservations (booked; an
// atom a reservation books over several ranges counts once for it). Keys
// with all-zero counts are left out.
func Recompute(ctx context.Context, q store.Querier) (map[Key]Counts, error) {
	out := map[Key]Counts{}
	err := scanCounts(ctx, q, out, func(c *Counts, total, quarantined, _ int64) {
		c.Total, c.Quarantined = int(total), int(quarantined)
	}, `SELECT np.pool_id, a.model, a.kind, COUNT(*),
			COALESCE(SUM(CASE WHEN a.quarantined OR a.partition_pending THEN 1 ELSE 0 END), 0), 0
		FROM atoms a JOIN node_pools np ON np.node_id = a.node_id
		WHERE np.pool_id <> '' AND a.kind IN `+rolledKinds+`
		GROUP BY np.pool_id, a.model, a.kind`)
	if err != nil {
		return nil, fmt.Errorf("recompute capacity totals: %w", err)
	}
	err = scanCounts(ctx, q, out, func(c *Counts, booked, _, _ int64) {
		c.Booked = int(booked)
	}, `SELECT held.pool_id, held.model, held.kind, COUNT(*), 0, 0
		FROM (SELECT DISTINCT r.id AS reservation_id, r.pool_id AS pool_id, a.id AS atom_id, a.model AS model, a.kind AS kind
			FROM reservations r
			JOIN bookings b ON b.reservation_id = r.id
			JOIN atoms a ON a.id = b.atom
			WHERE r.state IN `+liveStates+` AND a.kind IN `+rolledKinds+`) held
		GROUP BY held.pool_id, held.model, held.kind`)
	if err != nil {
		return nil, fmt.Errorf("recompute capacity bookings: %w", err)
	}
	dropZero(out)
	return out, nil
}

// Check tests the rollup invariant: for every key, the stored rollup equals
// the recomputed one (a key with all-zero counts is the same as an absent
// key). It returns one line per differing key, sorted; none means the
// invariant holds.
func Check(ctx context.Context, q store.Querier) (mismatches []string, err error) {
	mismatches, _, err = check(ctx, q)
	return mismatches, err
}

func check(ctx context.Context, q store.Querier) ([]string, map[Key]Counts, error) {
	stored, err := storedSums(ctx, q)
	if err != nil {
		return nil, nil, err
	}
	want, err := Recompute(ctx, q)
	if err != nil {
		return nil, nil, err
	}
	return diff(stored, want), want, nil
}

func diff(stored, want map[Key]Counts) []string {
	var out []string
	for _, k := range sortedKeys(stored, want) {
		if s, w := stored[k], want[k]; s != w {
			out = append(out, fmt.Sprintf("%s: stored %s, recomputed %s", k, s, w))
		}
	}
	return out
}

func sortedKeys(ms ...map[Key]Counts) []Key {
	seen := map[Key]bool{}
	var keys []Key
	for _, m := range ms {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	slices.SortFunc(keys, func(a, b Key) int {
		return cmp.Or(cmp.Compare(a.PoolID, b.PoolID), cmp.Compare(a.Model, b.Model), cmp.Compare(a.Kind, b.Kind))
	})
	return keys
}

// Rebuild replaces the stored rollups with a recomputation, in the caller's
// transaction: it deletes every delta and writes one row per recomputed key.
// It returns what Check would have said before, and the rows written.
//
// On PostgreSQL it first locks capacity_deltas against inserts until the
// transaction ends. A writer that changed atoms or reservations but has not
// inserted its delta yet then waits, and its delta lands on top of a rebuild
// that did not see its change; one that already inserted is waited for
// before the recomputation reads. Either way no change is counted twice or
// lost. SQLite has one writer, so nothing interleaves there.
func Rebuild(ctx context.Context, tx store.Tx) (mismatches []string, rows int, err error) {
	if tx.Dialect() == store.Postgres {
		if _, err := tx.Exec(ctx, `LOCK TABLE capacity_deltas IN EXCLUSIVE MODE`); err != nil {
			return nil, 0, fmt.Errorf("lock capacity rollups: %w", err)
		}
	}
	mismatches, want, err := check(ctx, tx)
	if err != nil {
		return nil, 0, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM capacity_deltas`); err != nil {
		return nil, 0, fmt.Errorf("clear capacity rollups: %w", err)
	}
	for _, k := range sortedKeys(want) {
		c := want[k]
		if _, err := tx.Exec(ctx, `INSERT INTO capacity_deltas (pool_id, model, kind, total, booked, quarantined)
			VALUES ($1, $2, $3, $4, $5, $6)`, k.PoolID, k.Model, k.Kind, c.Total, c.Booked, c.Quarantined); err != nil {
			return nil, 0, fmt.Errorf("write capacity rollup %s: %w", k, err)
		}
		rows++
	}
	return mismatches, rows, nil
}

// Compact folds the deltas into one row per key (dropping keys that sum to
// zero), keeping every key's sums. It folds only the deltas with an id up
// to the largest one it reads first, so deltas inserted meanwhile stay as
// they are for the next run. On PostgreSQL the fold is one statement that
// deletes the deltas and inserts their sums from exactly the rows it
// deleted, so a delta committed while it runs is never deleted unfolded;
// SQLite has one writer, so two statements are as safe there.
func Compact(ctx context.Context, tx store.Tx) error {
	var upTo int64
	if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(id), 0) FROM capacity_deltas`).Scan(&upTo); err != nil {
		return fmt.Errorf("compact capacity rollups: %w", err)
	}
	var deltas, keys int64
	if err := tx.QueryRow(ctx, `SELECT COUNT(*),
			(SELECT COUNT(*) FROM (SELECT DISTINCT pool_id, model, kind FROM capacity_deltas WHERE id <= $1) k)
		FROM capacity_deltas WHERE id <= $1`, upTo).Scan(&deltas, &keys); err != nil {
		return fmt.Errorf("compact capacity rollups: %w", err)
	}
	if deltas == keys {
		return nil // already one row per key
	}
	const sums = `SELECT pool_id, model, kind, SUM(total), SUM(booked), SUM(quarantined)`
	const nonZero = ` GROUP BY pool_id, model, kind
		HAVING SUM(total) <> 0 OR SUM(booked) <> 0 OR SUM(quarantined) <> 0`
	const insert = `INSERT INTO capacity_deltas (pool_id, model, kind, total, booked, quarantined) `
	switch tx.Dialect() {
	case store.Postgres:
		if _, err := tx.Exec(ctx, `WITH folded AS (
				DELETE FROM capacity_deltas WHERE id <= $1
				RETURNING pool_id, model, kind, total, booked, quarantined)
			`+insert+sums+` FROM folded`+nonZero, upTo); err != nil {
			return fmt.Errorf("compact capacity rollups: %w", err)
		}
	default:
		if _, err := tx.Exec(ctx, insert+sums+` FROM capacity_deltas WHERE id <= $1`+nonZero, upTo); err != nil {
			return fmt.Errorf("compact capacity rollups: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM capacity_deltas WHERE id <= $1`, upTo); err != nil {
			return fmt.Errorf("compact capacity rollups: %w", err)
		}
	}
	return nil
}

// PendingCount is the number of a pool's reservations waiting for capacity.
type PendingCount struct {
	PoolID   string
	PoolName string
	TenantID string
	Count    int
}

// Pending counts the reservations waiting for capacity (state pending) per
// pool id, for the pools of one tenant or, with tenantID "", of every
// tenant. Pools with none are absent.
func Pending(ctx context.Context, q store.Querier, tenantID string) (map[string]PendingCount, error) {
	rows, err := q.Query(ctx, `SELECT r.pool_id, p.name, p.tenant_id, COUNT(*)
		FROM reservations r JOIN pools p ON p.id = r.pool_id
		WHERE r.state = 'pending' AND ($1 = '' OR p.tenant_id = $1)
		GROUP BY r.pool_id, p.name, p.tenant_id`, tenantID)
	if err != nil {
		return nil, fmt.Errorf("count pending reservations: %w", err)
	}
	defer rows.Close()
	out := map[string]PendingCount{}
	for rows.Next() {
		var (
			pc PendingCount
			n  int64
		)
		if err := rows.Scan(&pc.PoolID, &pc.PoolName, &pc.TenantID, &n); err != nil {
			return nil, fmt.Errorf("count pending reservations: %w", err)
		}
		pc.Count = int(n)
		out[pc.PoolID] = pc
	}
	return out, rows.Err()
}

// BookedNow counts, per key, the atoms that bookings of placed, binding or
// active reservations hold at the instant now (a booking holds [starts_at,
// ends_at)), for the pools of one tenant or, with tenantID "", of every
// tenant. The stored rollups count a booked atom from its placement on,
// however far ahead its window starts; "booked" in the summaries means
// booked now, and future bookings belong to the timeline.
func BookedNow(ctx context.Context, q store.Querier, tenantID string, now time.Time) (map[Key]int, error) {
	rows, err := q.Query(ctx, `SELECT r.pool_id, a.model, a.kind, COUNT(DISTINCT a.id)
		FROM bookings b
		JOIN reservations r ON r.id = b.reservation_id
		JOIN atoms a ON a.id = b.atom
		JOIN pools p ON p.id = r.pool_id
		WHERE r.state IN `+liveStates+` AND a.kind IN `+rolledKinds+`
		  AND b.starts_at <= $2 AND b.ends_at > $2 AND ($1 = '' OR p.tenant_id = $1)
		GROUP BY r.pool_id, a.model, a.kind`, tenantID, now)
	if err != nil {
		return nil, fmt.Errorf("count atoms booked now: %w", err)
	}
	defer rows.Close()
	out := map[Key]int{}
	for rows.Next() {
		var (
			k Key
			n int64
		)
		if err := rows.Scan(&k.PoolID, &k.Model, &k.Kind, &n); err != nil {
			return nil, fmt.Errorf("count atoms booked now: %w", err)
		}
		out[k] = int(n)
	}
	return out, rows.Err()
}

// Point is the pool's GPU capacity at one instant.
type Point struct {
	Time   time.Time
	Booked int
	Total  int
}

// Timeline returns one point every step from start to end (inclusive when
// it falls on a step): total is the pool's stored gpu rollup, booked the
// gpu atoms that bookings of the pool's placed, binding or active
// reservations hold at that instant (a booking holds [starts_at, ends_at)).
// The caller bounds the number of points.
func Timeline(ctx context.Context, q store.Querier, poolID string, start, end time.Time, step time.Duration) ([]Point, error) {
	if step <= 0 || end.Before(start) {
		return nil, fmt.Errorf("timeline: want start <= end and a positive step, got %s..%s step %s", start, end, step)
	}
	var total int64
	if err := q.QueryRow(ctx, `SELECT COALESCE(SUM(total), 0) FROM capacity_deltas WHERE pool_id = $1 AND kind = 'gpu'`,
		poolID).Scan(&total); err != nil {
		return nil, fmt.Errorf("timeline total: %w", err)
	}
	rows, err := q.Query(ctx, `SELECT b.starts_at, b.ends_at
		FROM bookings b
		JOIN reservations r ON r.id = b.reservation_id
		JOIN atoms a ON a.id = b.atom
		WHERE r.pool_id = $1 AND r.state IN `+liveStates+` AND a.kind = 'gpu'
		  AND b.starts_at <= $3 AND b.ends_at > $2`, poolID, start, end)
	if err != nil {
		return nil, fmt.Errorf("timeline bookings: %w", err)
	}
	defer rows.Close()
	var starts, ends []time.Time
	for rows.Next() {
		var s, e time.Time
		if err := rows.Scan(&s, &e); err != nil {
			return nil, fmt.Errorf("timeline bookings: %w", err)
		}
		starts, ends = append(starts, s), append(ends, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("timeline bookings: %w", err)
	}
	sortTimes(starts)
	sortTimes(ends)
	// Booked at t: bookings started at or before t minus those ended at or
	// before t (every booking ends after it starts).
	atOrBefore := func(ts []time.Time, t time.Time) int {
		return sort.Search(len(ts), func(i int) bool { return ts[i].After(t) })
	}
	var out []Point
	for t := start; !t.After(end); t = t.Add(step) {
		out = append(out, Point{Time: t, Booked: atOrBefore(starts, t) - atOrBefore(ends, t), Total: int(total)})
	}
	return out, nil
}

func sortTimes(ts []time.Time) {
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
}

// ConsumerRow is one consumer tenant's hold on one pool of an owner.
type ConsumerRow struct {
	PoolID, PoolName, TenantID, TenantName string
	Reservations, GPUs                     int
	GPUHours                               float64
}

// ByConsumer sums, per pool of ownerID (or only poolID) and per consumer
// tenant, the live reservations and their GPUs (slots and MIG instances
// count as asked), and the GPU-hours recorded in [from, to).
func ByConsumer(ctx context.Context, q store.Querier, ownerID, poolID string, from, to time.Time) ([]ConsumerRow, error) {
	rows, err := q.Query(ctx, `SELECT r.pool_id, p.name, r.tenant_id, t.name, COUNT(*), COALESCE(SUM(r.gpus + r.slots), 0)
		FROM reservations r JOIN pools p ON p.id = r.pool_id JOIN tenants t ON t.id = r.tenant_id
		WHERE p.tenant_id = $1 AND ($2 = '' OR p.id = $2) AND r.state IN `+liveStates+`
		GROUP BY r.pool_id, p.name, r.tenant_id, t.name`, ownerID, poolID)
	if err != nil {
		return nil, err
	}
	type key struct{ pool, tenant string }
	byKey := map[key]*ConsumerRow{}
	var out []*ConsumerRow
	for rows.Next() {
		var c ConsumerRow
		if err := rows.Scan(&c.PoolID, &c.PoolName, &c.TenantID, &c.TenantName, &c.Reservations, &c.GPUs); err != nil {
			rows.Close()
			return nil, err
		}
		byKey[key{c.PoolID, c.TenantID}] = &c
		out = append(out, &c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = q.Query(ctx, `SELECT r.pool_id, p.name, r.tenant_id, t.name, SUM(w.quantity)
		FROM usage_windows w JOIN reservations r ON r.id = w.reservation_id
		JOIN pools p ON p.id = r.pool_id JOIN tenants t ON t.id = r.tenant_id
		WHERE p.tenant_id = $1 AND ($2 = '' OR p.id = $2) AND w.metric LIKE 'gpu.%'
		AND w.window_start >= $3 AND w.window_start < $4
		GROUP BY r.pool_id, p.name, r.tenant_id, t.name`, ownerID, poolID, from, to)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var c ConsumerRow
		if err := rows.Scan(&c.PoolID, &c.PoolName, &c.TenantID, &c.TenantName, &c.GPUHours); err != nil {
			return nil, err
		}
		if have := byKey[key{c.PoolID, c.TenantID}]; have != nil {
			have.GPUHours = c.GPUHours
			continue
		}
		byKey[key{c.PoolID, c.TenantID}] = &c
		out = append(out, &c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	res := make([]ConsumerRow, 0, len(out))
	for _, c := range out {
		res = append(res, *c)
	}
	slices.SortFunc(res, func(a, b ConsumerRow) int {
		return cmp.Or(cmp.Compare(a.PoolName, b.PoolName), cmp.Compare(a.PoolID, b.PoolID), cmp.Compare(a.TenantName, b.TenantName))
	})
	return res, nil
}
