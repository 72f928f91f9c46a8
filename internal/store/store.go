// Package store is the one boundary between Better Compute and its database.
// It opens SQLite or PostgreSQL behind one API, runs every mutation as a
// single transaction (retrying serialization failures), classifies driver
// errors into domain errors, applies each module's embedded forward-only
// migrations under a lock, and shares one settable clock with SQL through
// compute_now().
//
// It must never contain module SQL or business rules: modules bring their own
// statements and migrations; the store only runs them. Dialect implementations
// live in store/sqlite and store/postgres and differ only where they must.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/better-compute/internal/clock"
)

// Dialect names the SQL dialect a database speaks; module stores pick their
// statements by it.
type Dialect string

// The dialects the store supports.
const (
	SQLite   Dialect = "sqlite"
	Postgres Dialect = "postgres"
)

// SQLiteTimeLayout is the one text format of every timestamp on SQLite. It is
// fixed-width UTC with microseconds so that text comparison orders times
// correctly and matches PostgreSQL's precision.
const SQLiteTimeLayout = "2006-01-02T15:04:05.000000Z"

// Rows iterates a query result.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// Row is a single-row result. Scan returns an error matching ErrNotFound when
// the query returned no row.
type Row interface {
	Scan(dest ...any) error
}

// Querier runs statements written in "$1, $2" placeholder style.
type Querier interface {
	// Exec runs a statement and returns the number of rows affected.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	Query(ctx context.Context, query string, args ...any) (Rows, error)
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// Tx is a transaction handed to a Write or Read callback.
type Tx interface {
	Querier
	Dialect() Dialect
	// Raw returns the driver transaction (*sql.Tx on SQLite, pgx.Tx on
	// PostgreSQL) for libraries that must join it, such as River's InsertTx.
	Raw() any
	// AfterCommit runs fn after the transaction commits, so that side effects
	// outside the database (waking watchers) never announce a rolled-back
	// change. fn does not run if the transaction rolls back or is retried.
	AfterCommit(fn func())
}

// Driver is what a dialect must provide. DB wraps one; the implementations
// live in store/sqlite and store/postgres.
type Driver interface {
	Dialect() Dialect
	// Begin starts a transaction: read-write on the single writer, or
	// read-only from the reader pool. It makes compute_now() follow the
	// driver's clock for the whole transaction.
	Begin(ctx context.Context, readOnly bool) (DriverTx, error)
	// Classify turns a driver error into an *Error with a domain Kind, or
	// returns err unchanged when it is not one the store knows.
	Classify(err error) error
	// PrepareMigration readies a migration's write transaction: on
	// PostgreSQL it lifts the statement bound every pooled connection has
	// (a migration may rewrite a large table) and sets its own lock bound.
	PrepareMigration(ctx context.Context, tx DriverTx) error
	// LockMigrations serializes migrators across processes until unlock.
	LockMigrations(ctx context.Context) (unlock func(), err error)
	// TableExists reports whether a table exists, so the store can bootstrap
	// its own schema_migrations table.
	TableExists(ctx context.Context, q Querier, table string) (bool, error)
	SQLDB() *sql.DB
	PgxPool() *pgxpool.Pool
	SupportsListener() bool
	Close() error
}

// DriverTx is a dialect's transaction. Its errors are raw driver errors; DB
// classifies them.
type DriverTx interface {
	Querier
	Raw() any
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// maxRetries is how many times Write reruns fn after a serialization failure.
const maxRetries = 3

// DB is an open database.
type DB struct {
	d     Driver
	clock clock.Clock
}

// New wraps an opened dialect driver. Most callers use storeopen.Open.
func New(d Driver, clk clock.Clock) *DB {
	if clk == nil {
		clk = clock.Real{}
	}
	return &DB{d: d, clock: clk}
}

// Dialect returns the SQL dialect of the database.
func (db *DB) Dialect() Dialect { return db.d.Dialect() }

// Clock returns the clock that compute_now() follows.
func (db *DB) Clock() clock.Clock { return db.clock }

// SQLDB returns the SQLite single-writer handle (nil on PostgreSQL). River on
// SQLite must use it so that its writes queue behind ours instead of failing
// with SQLITE_BUSY.
func (db *DB) SQLDB() *sql.DB { return db.d.SQLDB() }

// PgxPool returns the PostgreSQL pool (nil on SQLite).
func (db *DB) PgxPool() *pgxpool.Pool { return db.d.PgxPool() }

// SupportsListener reports whether the database can push notifications
// (LISTEN/NOTIFY). It is false on SQLite, where watchers must poll.
func (db *DB) SupportsListener() bool { return db.d.SupportsListener() }

// Close closes the database.
func (db *DB) Close() error { return db.d.Close() }

// Write runs fn in one read-write transaction and commits it when fn returns
// nil. A serialization failure (from fn's statements or from the commit)
// reruns fn in a fresh transaction up to maxRetries times, so fn must not have
// side effects outside the transaction; use Tx.AfterCommit for those. Do not
// call Write or Read on the same DB from inside fn: on SQLite the single
// writer would deadlock.
func (db *DB) Write(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error {
	return db.write(ctx, nil, fn)
}

func (db *DB) write(ctx context.Context, prepare func(context.Context, DriverTx) error, fn func(ctx context.Context, tx Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := db.run(ctx, false, prepare, fn)
		if err == nil || !errors.Is(err, ErrSerialization) || attempt >= maxRetries {
			return err
		}
		// Jitter keeps conflicting writers from colliding again in lockstep.
		backoff := time.Duration(1+rand.IntN(10*(attempt+1))) * time.Millisecond
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
	}
}

// Ping reads from the database once (a readiness probe).
func (db *DB) Ping(ctx context.Context) error {
	return db.Read(ctx, func(ctx context.Context, tx Tx) error {
		var one int
		return tx.QueryRow(ctx, `SELECT 1`).Scan(&one)
	})
}

// Read runs fn in one read-only transaction from the reader pool, so reads
// never wait for the writer. It sees data committed before it began.
func (db *DB) Read(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error {
	return db.run(ctx, true, nil, fn)
}

// run runs fn in one transaction; prepare, when set, runs first on the
// driver transaction (a migration's own settings).
func (db *DB) run(ctx context.Context, readOnly bool, prepare func(context.Context, DriverTx) error, fn func(ctx context.Context, tx Tx) error) (err error) {
	dtx, err := db.d.Begin(ctx, readOnly)
	if err != nil {
		return fmt.Errorf("begin: %w", db.d.Classify(err))
	}
	if prepare != nil {
		if err := prepare(ctx, dtx); err != nil {
			_ = dtx.Rollback(context.WithoutCancel(ctx))
			return fmt.Errorf("prepare: %w", db.d.Classify(err))
		}
	}
	t := &tx{dtx: dtx, db: db}
	done := false
	defer func() {
		if done {
			return
		}
		// A panic or an error from fn: roll back on a context that is not
		// cancelled, so the connection goes back to the pool clean.
		_ = dtx.Rollback(context.WithoutCancel(ctx))
	}()
	if err := fn(ctx, t); err != nil {
		return err
	}
	done = true
	if err := dtx.Commit(ctx); err != nil {
		_ = dtx.Rollback(context.WithoutCancel(ctx))
		return fmt.Errorf("commit: %w", db.d.Classify(err))
	}
	for _, f := range t.afterCommit {
		f()
	}
	return nil
}

type tx struct {
	dtx         DriverTx
	db          *DB
	afterCommit []func()
	// now is compute_now() as this transaction read it, for rows written
	// by COPY (which takes values, not SQL); zero until first asked.
	now time.Time
}

// computeNow is compute_now() of the transaction, read once: on PostgreSQL
// it is constant within a transaction (the pinned clock, or now()).
func (t *tx) computeNow(ctx context.Context) (time.Time, error) {
	if t.now.IsZero() {
		if err := t.QueryRow(ctx, `SELECT compute_now()`).Scan(&t.now); err != nil {
			return time.Time{}, err
		}
	}
	return t.now, nil
}

func (t *tx) Dialect() Dialect { return t.db.d.Dialect() }

func (t *tx) Raw() any { return t.dtx.Raw() }

func (t *tx) AfterCommit(fn func()) { t.afterCommit = append(t.afterCommit, fn) }

func (t *tx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	n, err := t.dtx.Exec(ctx, query, args...)
	if err != nil {
		return n, t.db.d.Classify(err)
	}
	return n, nil
}

// copier is a driver transaction that writes rows with COPY (PostgreSQL).
type copier interface {
	CopyRows(ctx context.Context, table string, cols []string, rows [][]any) (int64, error)
}

// copyRows writes rows with COPY where the driver can: ok is false when it
// cannot, and nothing was written.
func (t *tx) copyRows(ctx context.Context, table string, cols []string, rows [][]any) (ok bool, err error) {
	c, can := t.dtx.(copier)
	if !can {
		return false, nil
	}
	if _, err := c.CopyRows(ctx, table, cols, rows); err != nil {
		return true, t.db.d.Classify(err)
	}
	return true, nil
}

func (t *tx) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	r, err := t.dtx.Query(ctx, query, args...)
	if err != nil {
		return nil, t.db.d.Classify(err)
	}
	return &rows{r: r, classify: t.db.d.Classify}, nil
}

func (t *tx) QueryRow(ctx context.Context, query string, args ...any) Row {
	return &row{r: t.dtx.QueryRow(ctx, query, args...), classify: t.db.d.Classify}
}

type rows struct {
	r        Rows
	classify func(error) error
}

func (r *rows) Next() bool { return r.r.Next() }

func (r *rows) Scan(dest ...any) error { return classifyNil(r.classify, r.r.Scan(dest...)) }

func (r *rows) Err() error { return classifyNil(r.classify, r.r.Err()) }

func (r *rows) Close() error { return classifyNil(r.classify, r.r.Close()) }

type row struct {
	r        Row
	classify func(error) error
}

func (r *row) Scan(dest ...any) error { return classifyNil(r.classify, r.r.Scan(dest...)) }

func classifyNil(classify func(error) error, err error) error {
	if err == nil {
		return nil
	}
	return classify(err)
}

// DatabaseNow reads compute_now(): the database's idea of the time (the
// store's clock under a simulated one), for a check of clock skew.
func DatabaseNow(ctx context.Context, q Querier) (time.Time, error) {
	var t time.Time
	err := q.QueryRow(ctx, `SELECT compute_now()`).Scan(&t)
	return t, err
}
