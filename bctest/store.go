package bctest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/storeopen"
)

// PostgresURLEnv names the environment variable that switches the test kit
// from SQLite to a PostgreSQL server. Each test gets a database of its own
// on that server.
const PostgresURLEnv = "BC_TEST_POSTGRES_URL"

// Dialect returns the dialect NewDB opens: PostgreSQL when
// BC_TEST_POSTGRES_URL is set, SQLite otherwise.
func Dialect() store.Dialect {
	if os.Getenv(PostgresURLEnv) != "" {
		return store.Postgres
	}
	return store.SQLite
}

// NewDB opens a fresh database for one test, with the store's core
// migrations applied, and closes (and on PostgreSQL drops) it when the test
// ends. compute_now() follows clk; a nil clk gets a new SimClock, so a test
// is reproducible unless it asks for the real clock. Callers migrate their
// own module sets (and jobs.Migrations) themselves.
func NewDB(t testing.TB, clk clock.Clock) *store.DB {
	t.Helper()
	if clk == nil {
		clk = NewSimClock(time.Time{})
	}
	return OpenDB(t, NewStoreConfig(t, clk))
}

// NewStoreConfig creates a fresh, empty database for one test (a temporary
// state directory, or a new database on BC_TEST_POSTGRES_URL's server that
// is dropped at cleanup) and returns the config that opens it. Open it more
// than once with OpenDB to play several replicas sharing one database.
func NewStoreConfig(t testing.TB, clk clock.Clock) store.Config {
	t.Helper()
	cfg := store.Config{Clock: clk}
	if admin := os.Getenv(PostgresURLEnv); admin != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cfg.URL = createPostgresDB(t, ctx, admin)
	} else {
		cfg.StateDir = t.TempDir()
		// Private, as an operator's state directory should be: the store
		// warns about one others can read.
		if err := os.Chmod(cfg.StateDir, 0o700); err != nil {
			t.Fatalf("bctest: %v", err)
		}
	}
	return cfg
}

// OpenDB opens cfg, applies the store's core migrations, and closes the
// handle when the test ends.
func OpenDB(t testing.TB, cfg store.Config) *store.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := storeopen.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("bctest: open store: %v", err)
	}
	// Cleanups run last-in first-out: this close runs before the drop that
	// NewStoreConfig registered.
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("bctest: close store: %v", err)
		}
	})
	if err := db.Migrate(ctx); err != nil {
		t.Fatalf("bctest: migrate store core: %v", err)
	}
	return db
}

// createPostgresDB creates a uniquely named database on the server admin
// points at and returns its URL; the database is dropped at cleanup.
func createPostgresDB(t testing.TB, ctx context.Context, admin string) string {
	t.Helper()
	u, err := url.Parse(admin)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("bctest: %s must be a postgres:// URL", PostgresURLEnv)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "bc_t_" + hex.EncodeToString(b[:])

	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("bctest: connect to %s: %v", PostgresURLEnv, err)
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	_ = conn.Close(ctx)
	if err != nil {
		t.Fatalf("bctest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("bctest: connect to drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("bctest: drop database %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}
