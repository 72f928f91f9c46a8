package store

import (
	"log/slog"

	"github.com/better-compute/better-compute/internal/clock"
)

// Config says which database to open; storeopen.Open reads it.
type Config struct {
	// URL is "" or "sqlite:" for SQLite under StateDir, or "postgres://..."
	// for PostgreSQL.
	URL string
	// StateDir holds the SQLite file better-compute.db (the directory is
	// created 0700, the database and its -wal and -shm files 0600).
	StateDir string
	// Clock is what compute_now() follows; default clock.Real{}.
	Clock clock.Clock
	// MaxReaders bounds the SQLite reader pool; default 4.
	MaxReaders int
	// Logger receives warnings about the state directory's permissions;
	// default slog.Default().
	Logger *slog.Logger
}
