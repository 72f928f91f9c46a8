package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/store"
)

// historyRowsPerTx bounds one history transaction (SQLite's WAL grows with
// it), give or take an atom's bookings.
const historyRowsPerTx = 100_000

// preloadHistory writes n ended bookings on the fleet's GPU atoms, about
// rowsPerTx a transaction, as past 1-GPU reservations leave them: every atom
// gets n/atoms bookings (the first n%atoms one more), the r-th newest over
// the hour [end-(r+1)h, end-r h), so an atom's bookings never overlap and all
// are over by end. GPU atoms only, in the bookings table: they are what every
// placement probes, and they keep one row per booking whatever becomes of
// CPU bookings. No reservation rows go with them: bookings have no foreign
// key, and the index and the rollups read only bookings still running or
// reservations still live.
//
// The rows are made by the database (INSERT … SELECT of the atoms crossed
// with a recursive CTE of rounds), atom by atom in id order, newest first:
// each index then grows at one place (ids start with the atom's), and on
// SQLite the overlap trigger finds no earlier booking of the atom to walk.
// Round by round instead, every insert lands on another page of a 1M-row
// index and the trigger walks all of an atom's earlier bookings: 3–4 times
// slower.
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
	// at is the time hours before end, as each dialect writes it.
	var at func(hours string) string
	if db.Dialect() == store.Postgres {
		at = func(hours string) string {
			return fmt.Sprintf("TIMESTAMPTZ '%s' - (%s) * INTERVAL '1 hour'", end.Format("2006-01-02 15:04:05Z"), hours)
		}
	} else {
		// store.SQLiteTimeLayout: fixed-width text, microseconds.
		at = func(hours string) string {
			return fmt.Sprintf(`strftime('%%Y-%%m-%%dT%%H:%%M:%%S', '%s', '-' || ((%s) * 3600) || ' seconds') || '.000000Z'`,
				end.Format("2006-01-02 15:04:05"), hours)
		}
	}
	// Atom k (in id order) gets base bookings, one more if k < extra.
	base, extra := n/atoms, n%atoms
	rounds := base
	if extra > 0 {
		rounds++
	}
	perTx := max(1, rowsPerTx/rounds)
	var chunks []historyChunk
	for lo := 0; lo < atoms && lo < n; lo += perTx {
		hi := min(lo+perTx, atoms)
		// The rounds carry their window, computed once a round rather than
		// once a row. CROSS JOIN keeps the atoms outer on SQLite.
		chunks = append(chunks, historyChunk{lo: lo, hi: hi, want: (hi-lo)*base + max(0, min(hi, extra)-lo),
			stmt: fmt.Sprintf(`WITH RECURSIVE r(n, s, e) AS (
				SELECT 0, %s, %s
				UNION ALL SELECT n + 1, %s, %s FROM r WHERE n + 1 < %d)
			INSERT INTO bookings (id, reservation_id, atom, starts_at, ends_at, create_time)
			SELECT 'bkg_hist_' || g.id || '_' || r.n, 'rsv_hist_' || g.id || '_' || r.n, g.id, r.s, r.e, r.s
			FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY id) - 1 AS k FROM atoms WHERE kind = '%s') g CROSS JOIN r
			WHERE g.k >= %d AND g.k < %d AND (r.n < %d OR g.k < %d)
			ORDER BY g.k, r.n`, at("1"), at("0"), at("n + 2"), at("n + 1"), rounds,
				reservation.KindGPU, lo, hi, base, extra)})
	}
	// SQLite has one writer. On PostgreSQL the exclusion constraint's GiST
	// index costs ~50 µs of server CPU a row (1M rows: about a minute of one
	// core), so the chunks, on disjoint atoms, are written on every core.
	workers := 1
	if db.Dialect() == store.Postgres {
		workers = runtime.NumCPU()
	}
	todo := make(chan historyChunk, len(chunks))
	for _, c := range chunks {
		todo <- c
	}
	close(todo)
	// The first failure stops the other workers.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for c := range todo {
				if errs[w] = c.write(ctx, db); errs[w] != nil {
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// historyChunk is one transaction of preloadHistory: GPU atoms [lo, hi) in
// id order, want rows.
type historyChunk struct {
	lo, hi, want int
	stmt         string
}

func (c historyChunk) write(ctx context.Context, db *store.DB) error {
	err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if db.Dialect() == store.Postgres {
			// A bulk load, not a request: no statement timeout the store
			// may set on its connections applies.
			if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = 0`); err != nil {
				return err
			}
		}
		got, err := tx.Exec(ctx, c.stmt)
		if err == nil && got != int64(c.want) {
			err = fmt.Errorf("wrote %d ended bookings, want %d", got, c.want)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("preload history (gpu atoms %d to %d): %w", c.lo, c.hi, err)
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
