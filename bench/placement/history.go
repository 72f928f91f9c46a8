package main

import (
	"context"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/store"
)

// historyRowsPerTx bounds one history transaction (SQLite's WAL grows with
// it), give or take a round.
const historyRowsPerTx = 200_000

// preloadHistory writes n ended bookings on the fleet's GPU atoms, about
// rowsPerTx a transaction, as past 1-GPU reservations leave them: round r
// books every GPU atom for the hour
// [end-(r+1)h, end-r h), round 0 ending at end, so an atom's bookings never
// overlap and all are over before the benchmark starts. GPU atoms only, in
// the bookings table: they are what every placement probes, and they keep
// one row per booking whatever becomes of CPU bookings. No reservation rows
// go with them (bookings have no foreign key; the index and the rollups
// read only bookings still running or reservations still live).
//
// The rows are made by the database (a recursive CTE crossed with the atoms,
// INSERT … SELECT), newest round first: on SQLite the overlap trigger then
// finds no earlier booking of the atom to walk, so the load stays linear.
func preloadHistory(ctx context.Context, db *store.DB, n int, end time.Time, rowsPerTx int) error {
	if n <= 0 {
		return nil
	}
	var atoms int
	if err := db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM atoms WHERE kind = $1`, reservation.KindGPU).Scan(&atoms)
	}); err != nil {
		return fmt.Errorf("count gpu atoms: %w", err)
	}
	if atoms == 0 {
		return fmt.Errorf("no gpu atoms to book %d ended bookings on", n)
	}
	end = end.UTC().Truncate(time.Second)
	// The window bounds, as each dialect computes them from the round r.n.
	var startExpr, endExpr string
	if db.Dialect() == store.Postgres {
		base := fmt.Sprintf("TIMESTAMPTZ '%s'", end.Format("2006-01-02 15:04:05Z"))
		startExpr = base + " - (r.n + 1) * INTERVAL '1 hour'"
		endExpr = base + " - r.n * INTERVAL '1 hour'"
	} else {
		// store.SQLiteTimeLayout: fixed-width text, microseconds.
		at := func(hours string) string {
			return fmt.Sprintf(`strftime('%%Y-%%m-%%dT%%H:%%M:%%S', '%s', '-' || ((%s) * 3600) || ' seconds') || '.000000Z'`,
				end.Format("2006-01-02 15:04:05"), hours)
		}
		startExpr, endExpr = at("r.n + 1"), at("r.n")
	}
	roundsPerTx := max(1, rowsPerTx/atoms)
	for done, round := 0, 0; done < n; round += roundsPerTx {
		rows := min(n-done, roundsPerTx*atoms)
		// CROSS JOIN keeps the rounds outer on SQLite (newest first).
		stmt := fmt.Sprintf(`WITH RECURSIVE r(n) AS (SELECT %d UNION ALL SELECT n + 1 FROM r WHERE n + 1 < %d)
			INSERT INTO bookings (id, reservation_id, atom, starts_at, ends_at, create_time)
			SELECT 'bkg_hist_' || r.n || '_' || a.id, 'rsv_hist_' || r.n || '_' || a.id, a.id, %s, %s, %s
			FROM r CROSS JOIN atoms a WHERE a.kind = '%s'
			LIMIT %d`, round, round+roundsPerTx, startExpr, endExpr, startExpr, reservation.KindGPU, rows)
		if err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			got, err := tx.Exec(ctx, stmt)
			if err == nil && got != int64(rows) {
				err = fmt.Errorf("wrote %d ended bookings, want %d", got, rows)
			}
			return err
		}); err != nil {
			return fmt.Errorf("preload history (rounds from %d): %w", round, err)
		}
		done += rows
	}
	return nil
}

// countEndedBookings is how many bookings ended at or before at.
func countEndedBookings(ctx context.Context, db *store.DB, at time.Time) (int64, error) {
	var n int64
	err := db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM bookings WHERE ends_at <= $1`, at).Scan(&n)
	})
	return n, err
}
