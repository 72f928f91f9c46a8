package storeopen_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
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
