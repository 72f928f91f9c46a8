// Package postgres is the PostgreSQL dialect of the store (pgx/v5 pool, no
// database/sql): read-committed write transactions, READ ONLY read
// transactions, statement_timeout and lock_timeout on every connection,
// SQLSTATE classification, a session advisory lock for migrations, and
// compute_now() pinned to the Go clock per transaction when
// that clock is not the real one.
//
// It must never contain module SQL or business rules, and must never be
// imported by modules: they reach it only through package store.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/store"
)

// Config says which server to connect to and which clock compute_now()
// follows.
type Config struct {
	URL   string
	Clock clock.Clock
	// StatementTimeout bounds every statement of a pooled connection
	// (statement_timeout); 0 takes store.DefaultStatementTimeout, a negative value
	// turns the bound off.
	StatementTimeout time.Duration
	// LockTimeout bounds every wait for a lock (lock_timeout); 0 takes
	// store.DefaultLockTimeout, a negative value turns the bound off.
	LockTimeout time.Duration
}

// Migrations run with no statement bound (an index build on a large table
// may take minutes) and a lock bound of their own: a DDL statement queued
// for a table lock blocks every later query of that table, so it gives up
// (and the start fails, saying why) rather than wait indefinitely.
const migrationLockTimeout = time.Minute

// timeoutSetting renders a bound as a PostgreSQL setting in milliseconds
// ("0" turns it off).
func timeoutSetting(d, def time.Duration) string {
	switch {
	case d == 0:
		d = def
	case d < 0:
		d = 0
	}
	return strconv.FormatInt(d.Milliseconds(), 10)
}

// Driver implements store.Driver for PostgreSQL.
type Driver struct {
	pool  *pgxpool.Pool
	clock clock.Clock
	// pinClock is set when the Go clock is not the real one: every
	// transaction then sets bc.now so SQL and Go share one settable clock.
	pinClock bool
}

var _ store.Driver = (*Driver)(nil)

// minPoolConns leaves room for River (its listener holds one connection for
// good) next to the control plane's own transactions, unless the URL sets
// pool_max_conns itself.
const minPoolConns = 16

// migrationLockKey is the advisory-lock key all migrators take; any constant
// unlikely to collide with another application's key works.
const migrationLockKey int64 = 0x6263_6d69_6772 // "bcmigr"

// Open connects and checks the server is reachable.
func Open(ctx context.Context, cfg Config) (*Driver, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse url: %w", err)
	}
	if !strings.Contains(cfg.URL, "pool_max_conns") && pcfg.MaxConns < minPoolConns {
		pcfg.MaxConns = minPoolConns
	}
	// Sent in the startup message, so every pooled connection (River's too)
	// has the bounds from its first statement at no extra round trip.
	// A value the URL sets itself (…?lock_timeout=2000) beats the default,
	// and an explicit Config value beats the URL.
	rp := pcfg.ConnConfig.RuntimeParams
	if _, inURL := rp["statement_timeout"]; !inURL || cfg.StatementTimeout != 0 {
		rp["statement_timeout"] = timeoutSetting(cfg.StatementTimeout, store.DefaultStatementTimeout)
	}
	if _, inURL := rp["lock_timeout"]; !inURL || cfg.LockTimeout != 0 {
		rp["lock_timeout"] = timeoutSetting(cfg.LockTimeout, store.DefaultLockTimeout)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: ping: %w", err)
	}
	clk := cfg.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	return &Driver{pool: pool, clock: clk, pinClock: !clock.IsReal(clk)}, nil
}

// Dialect implements store.Driver.
func (d *Driver) Dialect() store.Dialect { return store.Postgres }

// SQLDB returns nil: PostgreSQL is used through pgx directly.
func (d *Driver) SQLDB() *sql.DB { return nil }

// PgxPool returns the pool.
func (d *Driver) PgxPool() *pgxpool.Pool { return d.pool }

// SupportsListener is true: PostgreSQL has LISTEN/NOTIFY.
func (d *Driver) SupportsListener() bool { return true }

// Close closes the pool.
func (d *Driver) Close() error {
	d.pool.Close()
	return nil
}

// Begin starts a transaction and, under a simulated clock, pins
// compute_now() to the Go clock's current time for the transaction.
func (d *Driver) Begin(ctx context.Context, readOnly bool) (store.DriverTx, error) {
	opts := pgx.TxOptions{AccessMode: pgx.ReadWrite}
	if readOnly {
		opts.AccessMode = pgx.ReadOnly
	}
	t, err := d.pool.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	if d.pinClock {
		now := d.clock.Now().UTC().Format(time.RFC3339Nano)
		if _, err := t.Exec(ctx, `SELECT set_config('bc.now', $1, true)`, now); err != nil {
			_ = t.Rollback(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("pin clock: %w", err)
		}
	}
	return &tx{tx: t}, nil
}

// PrepareMigration lifts the statement bound and sets the migration lock
// bound for the migration's own transaction only (SET LOCAL).
func (d *Driver) PrepareMigration(ctx context.Context, t store.DriverTx) error {
	_, err := t.Exec(ctx, `SELECT set_config('statement_timeout', '0', true), set_config('lock_timeout', $1, true)`,
		timeoutSetting(migrationLockTimeout, 0))
	return err
}

// LockMigrations takes a session advisory lock on a connection of its own,
// held until unlock, so replicas starting together migrate one at a time.
func (d *Driver) LockMigrations(ctx context.Context) (func(), error) {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrationLockKey); err != nil {
		conn.Release()
		return nil, err
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, migrationLockKey); err != nil {
			// The lock dies with the session: close it rather than return a
			// connection that still holds it to the pool.
			_ = conn.Conn().Close(ctx)
		}
		conn.Release()
	}, nil
}

// TableExists implements store.Driver.
func (d *Driver) TableExists(ctx context.Context, q store.Querier, table string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT to_regclass($1::text) IS NOT NULL`, table).Scan(&ok)
	return ok, err
}

// SQLSTATEs the store classifies.
const (
	codeUniqueViolation      = "23505"
	codeExclusionViolation   = "23P01"
	codeCheckViolation       = "23514"
	codeForeignKeyViolation  = "23503"
	codeNotNullViolation     = "23502"
	codeRaiseException       = "P0001"
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
	// lock_not_available: lock_timeout ran out (or a NOWAIT lock was taken).
	codeLockNotAvailable = "55P03"
	// query_canceled: statement_timeout ran out, or a cancel request came;
	// only the first is a timeout, told apart by the server's message.
	codeQueryCanceled = "57014"
)

// statementTimeoutMessage is how the server words a statement_timeout
// cancel; a cancel request says "due to user request" instead.
const statementTimeoutMessage = "statement timeout"

// Classify maps SQLSTATEs to the store's domain errors.
func (d *Driver) Classify(err error) error {
	if err == nil {
		return nil
	}
	var se *store.Error
	if errors.As(err, &se) {
		return err
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return &store.Error{Kind: store.ErrNotFound, Err: err}
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case codeUniqueViolation:
		return &store.Error{Kind: store.ErrUnique, Constraint: pe.ConstraintName, Err: err}
	case codeExclusionViolation, codeCheckViolation, codeForeignKeyViolation, codeNotNullViolation, codeRaiseException:
		return &store.Error{Kind: store.ErrConstraint, Constraint: pe.ConstraintName, Err: err}
	case codeSerializationFailure, codeDeadlockDetected:
		return &store.Error{Kind: store.ErrSerialization, Err: err}
	case codeLockNotAvailable:
		return &store.Error{Kind: store.ErrLockTimeout, Err: err}
	case codeQueryCanceled:
		if strings.Contains(pe.Message, statementTimeoutMessage) {
			return &store.Error{Kind: store.ErrStatementTimeout, Err: err}
		}
	}
	return err
}

// tx adapts pgx.Tx to store.DriverTx.
type tx struct {
	tx pgx.Tx
}

func (t *tx) Raw() any { return t.tx }

func (t *tx) Commit(ctx context.Context) error { return t.tx.Commit(ctx) }

func (t *tx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

func (t *tx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := t.tx.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// CopyRows writes rows into table's cols with COPY: no statement to parse
// or plan, however many rows (store.InsertRows uses it for large batches).
func (t *tx) CopyRows(ctx context.Context, table string, cols []string, rows [][]any) (int64, error) {
	return t.tx.CopyFrom(ctx, pgx.Identifier{table}, cols, pgx.CopyFromRows(rows))
}

func (t *tx) Query(ctx context.Context, query string, args ...any) (store.Rows, error) {
	r, err := t.tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows{r}, nil
}

func (t *tx) QueryRow(ctx context.Context, query string, args ...any) store.Row {
	return t.tx.QueryRow(ctx, query, args...)
}

type rows struct{ r pgx.Rows }

func (r rows) Next() bool             { return r.r.Next() }
func (r rows) Scan(dest ...any) error { return r.r.Scan(dest...) }
func (r rows) Err() error             { return r.r.Err() }

// Close releases the connection and reports any error the iteration hit.
func (r rows) Close() error {
	r.r.Close()
	return r.r.Err()
}
