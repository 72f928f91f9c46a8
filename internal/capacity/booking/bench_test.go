package booking_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/store"
)

// benchAtoms is the width of one batch: 64 reservations, each one GPU of
// its own and one CPU range of its own node.
const benchAtoms = 64

// BenchmarkInsertHistory books batches of 64 reservations (a GPU atom and a
// CPU range each, one transaction per batch) into a store that holds H
// ended bookings of the same atoms and nodes, and H ended CPU ranges: the
// figure with 1,000,000 must stay within 10 % of the empty one, since the
// overlap probe skips what ended. Both stores are filled first, then
// measured in alternating rounds, so a busy machine's swings hit both
// alike. It runs on SQLite, and on PostgreSQL when BC_TEST_POSTGRES_URL is
// set.
//
//	go test ./internal/capacity/booking -run '^$' -bench InsertHistory -benchtime 1000x
func BenchmarkInsertHistory(b *testing.B) {
	type target struct {
		h    int
		db   *store.DB
		next int // the next batch's minute after t0
	}
	var targets []*target
	for _, h := range []int{0, 1_000_000} {
		db := bctest.NewDB(b, bctest.NewSimClock(t0))
		require.NoError(b, db.Migrate(context.Background(), booking.Migrations()))
		preloadHistory(b, db, h)
		targets = append(targets, &target{h: h, db: db})
	}
	const rounds = 3
	for range rounds {
		for _, tg := range targets {
			b.Run("history="+strconv.Itoa(tg.h), func(b *testing.B) {
				ctx := context.Background()
				atoms := make([]booking.Booking, benchAtoms)
				cpus := make([]booking.CPURange, benchAtoms)
				cpu0 := cpuTime()
				for b.Loop() {
					i := tg.next
					tg.next++
					from, to := t0.Add(time.Duration(i)*time.Minute), t0.Add(time.Duration(i+1)*time.Minute)
					for j := range benchAtoms {
						res := fmt.Sprintf("rsv-%d-%d", i, j)
						atoms[j] = booking.Booking{ReservationID: res, Atom: "gpu-" + strconv.Itoa(j), StartsAt: from, EndsAt: to}
						cpus[j] = booking.CPURange{ReservationID: res, NodeID: "node-" + strconv.Itoa(j), Lo: 0, Hi: 8, StartsAt: from, EndsAt: to}
					}
					err := tg.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
						return booking.Insert(ctx, tx, atoms, cpus)
					})
					if err != nil {
						b.Fatal(err)
					}
				}
				// This process's CPU per batch: SQLite's work (not
				// PostgreSQL's server), steadier than ns/op under load.
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
				b.ReportMetric(float64(benchAtoms*b.N)/b.Elapsed().Seconds(), "reservations/s")
			})
		}
	}
}

// preloadHistory writes h ended bookings and h ended CPU ranges, spread
// over the atoms and nodes the benchmark books, one minute each, all ended
// by t0, in one INSERT … SELECT per table over a generated series, so the
// overlap check runs on every row as it would for real.
func preloadHistory(b *testing.B, db *store.DB, h int) {
	b.Helper()
	if h == 0 {
		return
	}
	start := time.Now()
	ctx := context.Background()
	require.NoError(b, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		for _, q := range historyStatements(tx.Dialect()) {
			if _, err := tx.Exec(ctx, q, t0, h); err != nil {
				return err
			}
		}
		return nil
	}))
	if db.Dialect() == store.Postgres {
		require.NoError(b, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			_, err := tx.Exec(ctx, `ANALYZE bookings; ANALYZE cpu_bookings`)
			return err
		}))
	}
	b.Logf("preloaded %d ended bookings and %d ended cpu ranges in %s", h, h, time.Since(start).Round(time.Millisecond))
}

// historyStatements: row i books atom gpu-(i%64) (and node-(i%64)'s CPUs
// 0-7) for minute i/64 of the $2/64 minutes that end at t0 ($1). Rows go
// oldest first, as history is written: each probe then finds no booking
// ending after the new one starts.
func historyStatements(d store.Dialect) []string {
	if d == store.Postgres {
		return []string{
			`INSERT INTO bookings (id, reservation_id, atom, starts_at, ends_at, create_time)
			SELECT 'h' || i, 'hr' || i, 'gpu-' || (i % 64),
				$1::timestamptz - ($2::int / 64 + 1 - i / 64) * interval '1 minute', $1::timestamptz - ($2::int / 64 - i / 64) * interval '1 minute', $1::timestamptz
			FROM generate_series(0, $2::int - 1) AS i`,
			`INSERT INTO cpu_bookings (id, reservation_id, node_id, cpu_lo, cpu_hi, starts_at, ends_at, create_time)
			SELECT 'h' || i, 'hr' || i, 'node-' || (i % 64), 0, 8,
				$1::timestamptz - ($2::int / 64 + 1 - i / 64) * interval '1 minute', $1::timestamptz - ($2::int / 64 - i / 64) * interval '1 minute', $1::timestamptz
			FROM generate_series(0, $2::int - 1) AS i`,
		}
	}
	const minutes = `strftime('%Y-%m-%dT%H:%M:%S', substr($1, 1, 19), printf('-%d minutes', `
	return []string{
		`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < $2)
		INSERT INTO bookings (id, reservation_id, atom, starts_at, ends_at, create_time)
		SELECT 'h' || i, 'hr' || i, 'gpu-' || (i % 64),
			` + minutes + `$2 / 64 + 1 - i / 64)) || '.000000Z', ` + minutes + `$2 / 64 - i / 64)) || '.000000Z', $1
		FROM n`,
		`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < $2)
		INSERT INTO cpu_bookings (id, reservation_id, node_id, cpu_lo, cpu_hi, starts_at, ends_at, create_time)
		SELECT 'h' || i, 'hr' || i, 'node-' || (i % 64), 0, 8,
			` + minutes + `$2 / 64 + 1 - i / 64)) || '.000000Z', ` + minutes + `$2 / 64 - i / 64)) || '.000000Z', $1
		FROM n`,
	}
}
