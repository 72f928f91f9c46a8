package store

import (
	"log/slog"
	"time"

	"github.com/better-compute/better-compute/internal/clock"
)

// The bounds every pooled PostgreSQL connection sets by default, so that a
// stuck lock holder or a runaway query fails its callers with a retryable
// error instead of piling every request (and pool connection) up behind it.
const (
	DefaultStatementTimeout = 30 * time.Second
	DefaultLockTimeout      = 5 * time.Second
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
	// StatementTimeout and LockTimeout bound every statement and every lock
	// wait on PostgreSQL (statement_timeout, lock_timeout): 0 takes the
	// driver's default (30 s and 5 s), a negative value turns the bound off.
	// Past either, a statement fails with ErrStatementTimeout or
	// ErrLockTimeout. SQLite has neither (its writer waits on busy_timeout).
	StatementTimeout, LockTimeout time.Duration
	// Logger receives warnings about the state directory's permissions;
	// default slog.Default().
	Logger *slog.Logger
	// Exclusive (SQLite) holds a lock on the database for as long as it is
	// open: a control plane sets it, so a second one on the same state
	// directory refuses to start (naming the process that holds it) instead
	// of placing against bookings it cannot see. Tools that only read or
	// rotate keys (pki) leave it unset.
	Exclusive bool
}
