package views_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func hours(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Hour))) }

// reservationMigrations reads the reservation module's migrations from
// disk: the tables views read (node_pools, atoms, reservations,
// capacity_deltas) are created there, and the module's Go package may not
// be wired yet.
func reservationMigrations() store.Migrations {
	return store.Migrations{Module: "reservation", FS: os.DirFS("../reservation/migrations")}
}

// migrateCapacity makes sure db has the tables views read: the pool,
// booking and reservation modules' (unless something already created them,
// as a wired app does), and the reservations' active_since/active_until
// columns, added here when the reservation module does not have them yet.
func migrateCapacity(t testing.TB, db *store.DB) {
	t.Helper()
	ctx := context.Background()
	if !tableExists(db, "capacity_deltas") {
		// Pools name their owner and are offered to tenants.
		require.NoError(t, db.Migrate(ctx, tenancy.Migrations(), pool.Migrations(), booking.Migrations(), reservationMigrations()))
	}
	if !tableExists(db, "bookings") {
		require.NoError(t, db.Migrate(ctx, booking.Migrations()))
	}
	addActiveColumns(t, db)
}

func tableExists(db *store.DB, table string) bool {
	return db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var n int
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM `+table).Scan(&n)
	}) == nil
}

// addActiveColumns adds reservations.active_since and active_until where
// the reservation module's migrations do not (yet) create them.
func addActiveColumns(t testing.TB, db *store.DB) {
	t.Helper()
	ctx := context.Background()
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
}

// world writes the rows the reservation engine would, directly.
type world struct {
	t  testing.TB
	db *store.DB
}

func newDB(t testing.TB) (*store.DB, *world) {
	t.Helper()
	db := bctest.NewDB(t, bctest.NewSimClock(t0))
	migrateCapacity(t, db)
	return db, &world{t: t, db: db}
}

func (f *world) exec(query string, args ...any) {
	f.t.Helper()
	require.NoError(f.t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, query, args...)
		return err
	}))
}

func (f *world) pool(tenantID, id, name string) {
	f.t.Helper()
	require.NoError(f.t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return pool.Insert(ctx, tx, &pool.Pool{ID: id, TenantID: tenantID, Name: name, CreatedBy: "test", CreateTime: t0, UpdateTime: t0})
	}))
}

func (f *world) node(id, tenantID, poolID string) {
	f.t.Helper()
	f.exec(`INSERT INTO node_pools (node_id, tenant_id, pool_id, update_time) VALUES ($1, $2, $3, $4)`, id, tenantID, poolID, t0)
}

type atomOpt func(q, p *bool)

func quarantined(q, _ *bool)      { *q = true }
func partitionPending(_, p *bool) { *p = true }

func (f *world) atom(id, node, kind, model string, opts ...atomOpt) {
	f.t.Helper()
	var q, p bool
	for _, o := range opts {
		o(&q, &p)
	}
	f.exec(`INSERT INTO atoms (id, node_id, kind, gpu_uuid, model, quarantined, partition_pending, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, id, node, kind, id, model, q, p, t0)
}

func (f *world) reservation(id, tenantID, poolID, state string, gpus int) {
	f.t.Helper()
	f.exec(`INSERT INTO reservations (id, tenant_id, project_id, pool_id, state, gpus, gpu_model, binding,
			starts_at, ends_at, created_by, create_time, update_time)
		VALUES ($1, $2, 'prj', $3, $4, $5, 'H100', 'none', $6, $7, 'test', $6, $6)`,
		id, tenantID, poolID, state, gpus, t0, hours(24))
}

func (f *world) book(reservation, atom string, from, to time.Time) {
	f.t.Helper()
	require.NoError(f.t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return booking.Insert(ctx, tx, []booking.Booking{{ReservationID: reservation, Atom: atom, StartsAt: from, EndsAt: to}}, nil)
	}))
}

func (f *world) delta(poolID, model, kind string, total, booked, quarantined int) {
	f.t.Helper()
	f.exec(`INSERT INTO capacity_deltas (pool_id, model, kind, total, booked, quarantined) VALUES ($1, $2, $3, $4, $5, $6)`,
		poolID, model, kind, total, booked, quarantined)
}

func (f *world) deltaRows() int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM capacity_deltas`).Scan(&n)
	}))
	return n
}
