package storeopen_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/bctest/storetest"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/storeopen"
)

// TestConformance runs the store suite on SQLite, or on PostgreSQL when
// BC_TEST_POSTGRES_URL is set.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) *store.DB {
		return bctest.NewDB(t, bctest.NewSimClock(time.Time{}))
	})
}

func TestOpenSQLiteCreatesStateDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "state", "nested")
	for _, u := range []string{"", "sqlite:"} {
		db, err := storeopen.Open(context.Background(), store.Config{URL: u, StateDir: dir})
		require.NoError(t, err)
		assert.Equal(t, store.SQLite, db.Dialect())
		assert.NotNil(t, db.SQLDB())
		assert.Nil(t, db.PgxPool())
		assert.False(t, db.SupportsListener())
		require.NoError(t, db.Migrate(context.Background()))
		require.NoError(t, db.Close())
	}
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	_, err = os.Stat(filepath.Join(dir, storeopen.SQLiteFile))
	require.NoError(t, err)
}

func TestOpenRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  store.Config
	}{
		{"sqlite without state dir", store.Config{}},
		{"unknown scheme", store.Config{URL: "mysql://user:secret@host/db"}},
	}
	for _, tt := range tests {
		_, err := storeopen.Open(context.Background(), tt.cfg)
		require.Error(t, err, tt.name)
		assert.NotContains(t, err.Error(), "secret", "the URL's password must not leak")
	}
}

// TestReplicasMigrateTogether starts several handles on one database, as
// replicas starting at once would, and checks each migration applies once.
func TestReplicasMigrateTogether(t *testing.T) {
	t.Parallel()
	cfg := bctest.NewStoreConfig(t, bctest.NewSimClock(time.Time{}))
	set := store.Migrations{Module: "replicas", FS: fstest.MapFS{
		"sqlite/0001_a.sql":   &fstest.MapFile{Data: []byte(`CREATE TABLE rep (id INTEGER PRIMARY KEY); INSERT INTO rep (id) VALUES (1);`)},
		"postgres/0001_a.sql": &fstest.MapFile{Data: []byte(`CREATE TABLE rep (id INTEGER PRIMARY KEY); INSERT INTO rep (id) VALUES (1);`)},
		"sqlite/0002_b.sql":   &fstest.MapFile{Data: []byte(`INSERT INTO rep (id) VALUES (2);`)},
		"postgres/0002_b.sql": &fstest.MapFile{Data: []byte(`INSERT INTO rep (id) VALUES (2);`)},
	}}
	const replicas = 4
	dbs := make([]*store.DB, replicas)
	for i := range dbs {
		db, err := storeopen.Open(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		dbs[i] = db
	}
	var wg sync.WaitGroup
	errs := make([]error, replicas)
	for i, db := range dbs {
		wg.Go(func() { errs[i] = db.Migrate(context.Background(), set) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var n, versions int
	err := dbs[0].Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM rep`).Scan(&n); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM schema_migrations WHERE module = $1`, "replicas").Scan(&versions)
	})
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, 2, versions)
}

// TestOpenSQLiteFileModes: inside a state directory that already existed
// (so MkdirAll's 0700 does not apply), SQLite once created the database 0644
// and its -wal and -shm files alike. They are 0600 now, and a directory
// others can read is warned about.
func TestOpenSQLiteFileModes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	db, err := storeopen.Open(context.Background(), store.Config{StateDir: dir, Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	// A write makes SQLite create the -wal and -shm files.
	require.NoError(t, db.Migrate(context.Background()))
	for _, name := range []string{storeopen.SQLiteFile, storeopen.SQLiteFile + "-wal", storeopen.SQLiteFile + "-shm"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err, name)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), name)
	}
	assert.Contains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), "state directory is readable by group or others")

	// A private directory draws no warning.
	logs.Reset()
	require.NoError(t, os.Chmod(dir, 0o700))
	db2, err := storeopen.Open(context.Background(), store.Config{StateDir: dir, Logger: log})
	require.NoError(t, err)
	require.NoError(t, db2.Close())
	assert.Empty(t, logs.String())
}
