package booking

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// maxInList bounds an IN list where no dialect is at hand; it is under both
// limits with room for the statement's other parameters.
const maxInList = 10000

// placeholders returns "$from, $from+1, …" n times.
func placeholders(from, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(from + i))
	}
	return b.String()
}

func anys[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// Insert books atoms and CPU ranges in as few statements as the dialect's
// parameter limit allows (one multi-row INSERT per table for a batch of a
// few thousand rows). Empty Booking IDs are filled in. Bad input (no
// reservation id, atom or node; a CPU range that is empty or negative) is
// refused before anything is written. An overlap, with a stored booking or
// within the batch, returns an error matching ErrOverlap (an *OverlapError
// naming the atom or node); an end not after its start matches
// store.ErrConstraint. After an error the caller must roll back (the
// transaction, or its savepoint): rows of earlier statements of the batch
// may be in it.
func Insert(ctx context.Context, tx store.Tx, atoms []Booking, cpus []CPURange) error {
	for i := range atoms {
		b := &atoms[i]
		if b.ID == "" {
			b.ID = newID()
		}
		if b.Atom == "" || b.ReservationID == "" {
			return fmt.Errorf("booking %d (%s): atom and reservation id are required: %w", i, b.ID, store.ErrConstraint)
		}
	}
	for i, r := range cpus {
		if r.NodeID == "" || r.ReservationID == "" {
			return fmt.Errorf("cpu range %d: node and reservation id are required: %w", i, store.ErrConstraint)
		}
		if r.Lo < 0 || r.Hi <= r.Lo {
			return fmt.Errorf("cpu range %d of node %s: [%d, %d) is not a range of CPUs: %w", i, r.NodeID, r.Lo, r.Hi, store.ErrConstraint)
		}
	}
	// Rows go in atom (node, CPU) order, so two batches that want the same
	// atoms meet on the first of them instead of each taking one and
	// waiting for the other's (a deadlock on PostgreSQL).
	byAtom := make([]*Booking, len(atoms))
	for i := range atoms {
		byAtom[i] = &atoms[i]
	}
	slices.SortFunc(byAtom, func(a, b *Booking) int { return strings.Compare(a.Atom, b.Atom) })
	byNode := slices.Clone(cpus)
	slices.SortFunc(byNode, func(a, b CPURange) int {
		if c := strings.Compare(a.NodeID, b.NodeID); c != 0 {
			return c
		}
		return a.Lo - b.Lo
	})
	// create_time comes from the one clock.
	now := store.Raw("compute_now()")
	rows := make([][]any, len(byAtom))
	for i, b := range byAtom {
		rows[i] = []any{b.ID, b.ReservationID, b.Atom, norm(b.StartsAt), norm(b.EndsAt), now}
	}
	if err := store.InsertRows(ctx, tx, `INSERT INTO bookings (`+columns+`)`, "", rows); err != nil {
		return fmt.Errorf("insert %d bookings: %w", len(rows), classify(err))
	}
	rows = make([][]any, len(byNode))
	for i, r := range byNode {
		rows[i] = []any{newID(), r.ReservationID, r.NodeID, r.Lo, r.Hi, norm(r.StartsAt), norm(r.EndsAt), now}
	}
	if err := store.InsertRows(ctx, tx, `INSERT INTO cpu_bookings (`+cpuColumns+`)`, "", rows); err != nil {
		return fmt.Errorf("insert %d cpu ranges: %w", len(rows), classify(err))
	}
	return nil
}

// Release ends the reservations' bookings, both tables, at at: each
// booking's ends_at becomes max(starts_at+1µs, min(ends_at, at)), so a
// booking already over keeps its end, a running one ends at at, and one not
// yet started shrinks to its first microsecond. Releasing twice changes
// nothing the second time. It returns the number of rows changed (a CPU
// range is one row). One UPDATE per table (per maxInList reservations).
// Shrinking never overlaps, so the constraints never refuse it.
func Release(ctx context.Context, tx store.Tx, reservationIDs []string, at time.Time) (int64, error) {
	at = norm(at)
	floor := startPlusResolution(tx.Dialect())
	var n int64
	for chunk := range slices.Chunk(reservationIDs, maxInList) {
		args := append([]any{at}, anys(chunk)...)
		for _, table := range []string{"bookings", "cpu_bookings"} {
			// Only rows that change: ending after at, and not already
			// down to their first microsecond.
			c, err := tx.Exec(ctx, `UPDATE `+table+`
				SET ends_at = CASE WHEN starts_at < $1 THEN $1 ELSE `+floor+` END
				WHERE reservation_id IN (`+placeholders(2, len(chunk))+`)
				  AND ends_at > $1 AND ends_at > `+floor, args...)
			if err != nil {
				return n, fmt.Errorf("release %d reservations' %s: %w", len(chunk), table, classify(err))
			}
			n += c
		}
	}
	return n, nil
}

// startPlusResolution is the SQL for starts_at + 1µs. SQLite keeps times as
// fixed-width text (store.SQLiteTimeLayout, "2006-01-02T15:04:05.000000Z")
// and its date functions stop at milliseconds, so the microseconds field is
// incremented as text, carrying into the seconds through strftime.
func startPlusResolution(d store.Dialect) string {
	if d == store.Postgres {
		return `(starts_at + interval '1 microsecond')`
	}
	return `(CASE WHEN substr(starts_at, 21, 6) < '999999'
		THEN substr(starts_at, 1, 20) || printf('%06d', CAST(substr(starts_at, 21, 6) AS INTEGER) + 1) || 'Z'
		ELSE strftime('%Y-%m-%dT%H:%M:%S', substr(starts_at, 1, 19), '+1 seconds') || '.000000Z' END)`
}

// Extend moves the end of every booking of the reservation, both tables, to
// newEnd. There is no read before the write: when the new range overlaps
// another booking the database refuses the update and the error matches
// ErrOverlap; the caller's transaction must then roll back. A newEnd not
// after a booking's start fails with store.ErrConstraint. A reservation
// without bookings fails with store.ErrNotFound.
func Extend(ctx context.Context, tx store.Tx, reservationID string, newEnd time.Time) error {
	newEnd = norm(newEnd)
	var n int64
	for _, table := range []string{"bookings", "cpu_bookings"} {
		c, err := tx.Exec(ctx, `UPDATE `+table+` SET ends_at = $2 WHERE reservation_id = $1`, reservationID, newEnd)
		if err != nil {
			return fmt.Errorf("extend reservation %s: %w", reservationID, classify(err))
		}
		n += c
	}
	if n == 0 {
		return fmt.Errorf("extend reservation %s: no bookings: %w", reservationID, store.ErrNotFound)
	}
	return nil
}

// Delete drops the reservations' bookings, both tables (a requeued
// reservation is booked afresh where it lands). It returns the number of
// rows deleted.
func Delete(ctx context.Context, tx store.Tx, reservationIDs []string) (int64, error) {
	var n int64
	for chunk := range slices.Chunk(reservationIDs, maxInList) {
		for _, table := range []string{"bookings", "cpu_bookings"} {
			c, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE reservation_id IN (`+placeholders(1, len(chunk))+`)`, anys(chunk)...)
			if err != nil {
				return n, fmt.Errorf("delete %d reservations' %s: %w", len(chunk), table, err)
			}
			n += c
		}
	}
	return n, nil
}

// Current returns the bookings of the pool's nodes that end after after:
// what the placer's index must know. Atoms are matched to nodes through the
// atoms table, nodes to pools through node_pools (both owned by other
// modules of capacity). The (atom, ends_at) and (node_id, ends_at) indexes
// skip ended bookings, so history does not slow the load. Atoms come back
// ordered by atom and start, CPU ranges by node, start and CPU.
func Current(ctx context.Context, q store.Querier, poolID string, after time.Time) ([]Booking, []CPURange, error) {
	after = norm(after)
	atoms, err := scan(q.Query(ctx, `SELECT b.id, b.reservation_id, b.atom, b.starts_at, b.ends_at, b.create_time
		FROM node_pools np
		JOIN atoms a ON a.node_id = np.node_id
		JOIN bookings b ON b.atom = a.id
		WHERE np.pool_id = $1 AND b.ends_at > $2
		ORDER BY b.atom, b.starts_at, b.id`, poolID, after))
	if err != nil {
		return nil, nil, fmt.Errorf("current bookings of pool %s: %w", poolID, err)
	}
	rows, err := scanCPU(q.Query(ctx, `SELECT c.id, c.reservation_id, c.node_id, c.cpu_lo, c.cpu_hi, c.starts_at, c.ends_at, c.create_time
		FROM node_pools np
		JOIN cpu_bookings c ON c.node_id = np.node_id
		WHERE np.pool_id = $1 AND c.ends_at > $2
		ORDER BY c.node_id, c.starts_at, c.cpu_lo`, poolID, after))
	if err != nil {
		return nil, nil, fmt.Errorf("current cpu ranges of pool %s: %w", poolID, err)
	}
	cpus := make([]CPURange, len(rows))
	for i, r := range rows {
		cpus[i] = r.CPURange
	}
	return atoms, cpus, nil
}

// Archive moves up to limit bookings (both tables together, oldest end
// first) that ended before before into bookings_archive and
// cpu_bookings_archive, and returns how many it moved. A booking that ends
// at or after before never moves. Running it again moves only what is
// left, so the job may run as often as it likes; pass a before some way in
// the past, since an archived reservation can no longer be extended or
// released.
func Archive(ctx context.Context, tx store.Tx, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("archive: limit %d: want a positive number of bookings", limit)
	}
	before = norm(before)
	moved := 0
	for _, t := range []struct{ table, cols string }{{"bookings", columns}, {"cpu_bookings", cpuColumns}} {
		if moved >= limit {
			break
		}
		n, err := archiveTable(ctx, tx, t.table, t.cols, before, limit-moved)
		if err != nil {
			return moved, fmt.Errorf("archive %s ended before %s: %w", t.table, before.Format(time.RFC3339Nano), err)
		}
		moved += int(n)
	}
	return moved, nil
}

// archiveTable moves up to limit rows of table ending before before into
// table_archive. PostgreSQL does it in one statement (a DELETE … RETURNING
// feeding the INSERT); its DELETE checks ends_at again on the row it
// deletes, so a booking extended meanwhile by another transaction stays.
// SQLite has no data-modifying CTE: it copies, then deletes the same rows,
// picked by the same ordered scan of the ends_at index (nothing writes in
// between; SQLite has one writer).
func archiveTable(ctx context.Context, tx store.Tx, table, cols string, before time.Time, limit int) (int64, error) {
	if tx.Dialect() == store.Postgres {
		return tx.Exec(ctx, `WITH moved AS (
				DELETE FROM `+table+` WHERE ends_at < $1 AND id IN (
					SELECT id FROM `+table+` WHERE ends_at < $1 ORDER BY ends_at LIMIT $2)
				RETURNING `+cols+`)
			INSERT INTO `+table+`_archive (`+cols+`) SELECT `+cols+` FROM moved`, before, limit)
	}
	n, err := tx.Exec(ctx, `INSERT INTO `+table+`_archive (`+cols+`)
		SELECT `+cols+` FROM `+table+` WHERE ends_at < $1 ORDER BY ends_at, rowid LIMIT $2`, before, limit)
	if err != nil || n == 0 {
		return n, err
	}
	d, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE rowid IN (
		SELECT rowid FROM `+table+` WHERE ends_at < $1 ORDER BY ends_at, rowid LIMIT $2)`, before, limit)
	if err == nil && d != n {
		err = fmt.Errorf("copied %d rows but deleted %d", n, d)
	}
	return n, err
}
