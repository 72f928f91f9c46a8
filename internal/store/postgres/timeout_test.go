package postgres_test

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/store"
)

// openPostgres opens a fresh PostgreSQL test database with cfg's bounds, or
// skips: statement and lock bounds are PostgreSQL settings (SQLite's one
// writer waits on busy_timeout instead).
func openPostgres(t *testing.T, set func(*store.Config)) *store.DB {
	t.Helper()
	if bctest.Dialect() != store.Postgres {
		t.Skip("statement_timeout and lock_timeout are PostgreSQL settings; set " + bctest.PostgresURLEnv)
	}
	cfg := bctest.NewStoreConfig(t, nil)
	if set != nil {
		set(&cfg)
	}
	return bctest.OpenDB(t, cfg)
}

func settings(t *testing.T, db *store.DB) (statement, lock string) {
	t.Helper()
	require.NoError(t, db.Read(t.Context(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('lock_timeout')`).Scan(&statement, &lock)
	}))
	return statement, lock
}

func TestEveryConnectionIsBounded(t *testing.T) {
	t.Parallel()
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		st, lt := settings(t, openPostgres(t, nil))
		require.Equal(t, "30s", st)
		require.Equal(t, "5s", lt)
	})
	t.Run("configured", func(t *testing.T) {
		t.Parallel()
		st, lt := settings(t, openPostgres(t, func(c *store.Config) { c.StatementTimeout, c.LockTimeout = 2*time.Minute, 1500*time.Millisecond }))
		require.Equal(t, "2min", st)
		require.Equal(t, "1500ms", lt)
	})
	t.Run("off", func(t *testing.T) {
		t.Parallel()
		st, lt := settings(t, openPostgres(t, func(c *store.Config) { c.StatementTimeout, c.LockTimeout = -1, -1 }))
		require.Equal(t, "0", st)
		require.Equal(t, "0", lt)
	})
	t.Run("the URL's own value beats the default", func(t *testing.T) {
		t.Parallel()
		st, lt := settings(t, openPostgres(t, func(c *store.Config) { c.URL += "&lock_timeout=1234" }))
		require.Equal(t, "30s", st)
		require.Equal(t, "1234ms", lt)
	})
	t.Run("migrations lift the statement bound", func(t *testing.T) {
		t.Parallel()
		db := openPostgres(t, nil)
		mig := fstest.MapFS{"postgres/0001_settings.sql": {Data: []byte(
			`CREATE TABLE seen AS SELECT current_setting('statement_timeout') AS st, current_setting('lock_timeout') AS lt;`)}}
		require.NoError(t, db.Migrate(t.Context(), store.Migrations{Module: "timeouttest", FS: mig}))
		var st, lt string
		require.NoError(t, db.Read(t.Context(), func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT st, lt FROM seen`).Scan(&st, &lt)
		}))
		require.Equal(t, "0", st)
		require.Equal(t, "1min", lt)
		// SET LOCAL: the connection went back to the pool with the bounds.
		st, lt = settings(t, db)
		require.Equal(t, "30s", st)
		require.Equal(t, "5s", lt)
	})
}

// TestLockHeldElsewhereFailsTheWrite: a write that needs a row another
// transaction holds gives up after lock_timeout with ErrLockTimeout, instead
// of waiting for as long as the holder likes.
func TestLockHeldElsewhereFailsTheWrite(t *testing.T) {
	t.Parallel()
	db := openPostgres(t, func(c *store.Config) { c.LockTimeout = 100 * time.Millisecond })
	ctx := t.Context()
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE held (id INT PRIMARY KEY, n INT NOT NULL)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO held VALUES (1, 0)`)
		return err
	}))
	holder, err := db.PgxPool().Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	_, err = holder.Exec(ctx, `SELECT 1 FROM held WHERE id = 1 FOR UPDATE`)
	require.NoError(t, err)

	err = db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE held SET n = n + 1 WHERE id = 1`)
		return err
	})
	require.ErrorIs(t, err, store.ErrLockTimeout)

	// Nothing was written, and the row is writable once the holder ends.
	require.NoError(t, holder.Rollback(ctx))
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE held SET n = n + 1 WHERE id = 1`)
		return err
	}))
	var n int
	require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT n FROM held WHERE id = 1`).Scan(&n)
	}))
	require.Equal(t, 1, n)
}

// TestLongStatementFails: a statement past statement_timeout is cancelled
// with ErrStatementTimeout.
func TestLongStatementFails(t *testing.T) {
	t.Parallel()
	db := openPostgres(t, func(c *store.Config) { c.StatementTimeout = 100 * time.Millisecond })
	err := db.Read(t.Context(), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `SELECT pg_sleep(600)`)
		return err
	})
	require.ErrorIs(t, err, store.ErrStatementTimeout)
}
