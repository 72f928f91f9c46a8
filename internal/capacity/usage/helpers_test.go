package usage_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/store"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(h float64) time.Time { return t0.Add(time.Duration(h * float64(time.Hour))) }

// migrate makes sure db has the reservations table (from the reservation
// module's migrations on disk, unless a wired app created it), with the
// active_since/active_until columns (added here when the module lacks them),
// and the usage tables.
func migrate(t testing.TB, db *store.DB) {
	t.Helper()
	ctx := context.Background()
	if db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var n int
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM reservations`).Scan(&n)
	}) != nil {
		require.NoError(t, db.Migrate(ctx, store.Migrations{Module: "reservation", FS: os.DirFS("../reservation/migrations")}))
	}
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		for _, col := range []string{"active_since", "active_until"} {
			var n int
			q, typ := `SELECT COUNT(*) FROM pragma_table_info('reservations') WHERE name = $1`, "TIMESTAMP"
			if tx.Dialect() == store.Postgres {
				q, typ = `SELECT COUNT(*) FROM information_schema.columns
					WHERE table_schema = current_schema() AND table_name = 'reservations' AND column_name = $1`, "TIMESTAMPTZ"
			}
			if err := tx.QueryRow(ctx, q, col).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				if _, err := tx.Exec(ctx, `ALTER TABLE reservations ADD COLUMN `+col+` `+typ); err != nil {
					return err
				}
			}
		}
		return nil
	}))
	require.NoError(t, db.Migrate(ctx, usage.Migrations()))
}

func newDB(t testing.TB) *store.DB {
	t.Helper()
	db := bctest.NewDB(t, bctest.NewSimClock(t0))
	migrate(t, db)
	return db
}

// rsv is what the rollup reads of a reservation.
type rsv struct {
	id, tenant, project string
	gpus, vcpu, mem     int
	gpuModel, model     string
	pool                string // default pool_x
	since               time.Time
	until               *time.Time
}

func insertReservation(t testing.TB, db *store.DB, r rsv) {
	t.Helper()
	state := "active"
	if r.until != nil {
		state = "released"
	}
	if r.pool == "" {
		r.pool = "pool_x"
	}
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO reservations (id, tenant_id, project_id, pool_id, state, gpus, model, gpu_model,
				vcpu, memory_gib, binding, starts_at, ends_at, active_since, active_until, created_by, create_time, update_time)
			VALUES ($1, $2, $3, $13, $4, $5, $6, $7, $8, $9, 'none', $10, $11, $10, $12, 'test', $10, $10)`,
			r.id, r.tenant, r.project, state, r.gpus, r.model, r.gpuModel, r.vcpu, r.mem, r.since, r.since.Add(30*24*time.Hour), r.until, r.pool)
		return err
	}))
}

func setUntil(t testing.TB, db *store.DB, id string, until time.Time) {
	t.Helper()
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE reservations SET active_until = $2, state = 'released' WHERE id = $1`, id, until)
		return err
	}))
}

func rollup(t testing.TB, db *store.DB, upTo time.Time) int {
	t.Helper()
	var n int
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		n, err = usage.Rollup(ctx, tx, upTo, nil)
		return err
	}))
	return n
}

func list(t testing.TB, db *store.DB, p usage.ListParams) []usage.UsageWindow {
	t.Helper()
	if p.Limit == 0 {
		p.Limit = 10000
	}
	var out []usage.UsageWindow
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		out, err = usage.List(ctx, tx, &p)
		return err
	}))
	return out
}

func ptr[T any](v T) *T { return &v }
