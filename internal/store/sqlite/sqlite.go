// Package sqlite is the SQLite dialect of the store (modernc.org/sqlite, pure
// Go): one writer connection with immediate transactions, a read-only reader
// pool, WAL, compute_now() registered as a Go function over the DB's own
// clock, and timestamps as fixed-width UTC text.
//
// It must never contain module SQL or business rules, and must never be
// imported by modules: they reach it only through package store.
package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/store"
)

// Config says which file to open and which clock compute_now() follows.
type Config struct {
	Path       string
	Clock      clock.Clock
	MaxReaders int
	// Exclusive holds an exclusive lock on Path + ".lock" until Close: a
	// second Exclusive opening (another process, or this one) is refused
	// with ErrInUse, naming the holder.
	Exclusive bool
}

// Driver implements store.Driver for SQLite.
type Driver struct {
	path   string
	writer *sql.DB
	reader *sql.DB
	// checkpointer moves WAL pages into the database file in the
	// background, so no commit pays for a checkpoint's fsync.
	checkpointer *sql.DB
	// Prepared statements of the writer and the readers.
	wstmts, rstmts *stmtCache
	stop           chan struct{}
	done           chan struct{}
	// release lets go of the database's process lock.
	release func()
}

// checkpointInterval is how often the background checkpoint runs.
const checkpointInterval = time.Second

var _ store.Driver = (*Driver)(nil)

// busyTimeoutMS bounds how long a connection waits for another process's
// lock before SQLITE_BUSY (classified as ErrSerialization, so Write retries).
const busyTimeoutMS = 5000

// ErrInUse: another process (or another Open in this one) has the database
// open. SQLite's one-writer design is this store's invariant: a second
// control plane on the same file would place against an index that does
// not see the first one's bookings.
var ErrInUse = errors.New("sqlite: the database is in use")

// Open opens (creating if needed) the database file at cfg.Path; with
// cfg.Exclusive it holds the database's process lock until Close.
func Open(ctx context.Context, cfg Config) (drv *Driver, err error) {
	if cfg.Path == "" {
		return nil, errors.New("sqlite: path is empty")
	}
	release := func() {}
	if cfg.Exclusive {
		if release, err = holdFile(cfg.Path + ".lock"); err != nil {
			return nil, fmt.Errorf("sqlite: open %s: %w", cfg.Path, err)
		}
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	clk := cfg.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	maxReaders := cfg.MaxReaders
	if maxReaders <= 0 {
		maxReaders = 4
	}

	// A private driver per DB, so compute_now() closes over this DB's clock
	// and parallel tests with different SimClocks do not see each other's.
	d := &msqlite.Driver{}
	err = d.RegisterScalarFunction("compute_now", 0, func(*msqlite.FunctionContext, []driver.Value) (driver.Value, error) {
		return clk.Now().UTC().Format(store.SQLiteTimeLayout), nil
	})
	if err != nil {
		return nil, fmt.Errorf("sqlite: register compute_now: %w", err)
	}

	base := (&url.URL{Scheme: "file", Opaque: cfg.Path}).String()
	common := url.Values{}
	common.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeoutMS))
	common.Add("_pragma", "foreign_keys(1)")

	w := url.Values{}
	for k, v := range common {
		w[k] = append([]string(nil), v...)
	}
	w.Add("_pragma", "journal_mode(WAL)")
	w.Add("_pragma", "synchronous(NORMAL)")
	// Checkpoints run in the background (see checkpoint), not in whichever
	// commit crosses the WAL threshold: that commit would wait for an fsync
	// of the database file, and every transaction queued behind it too.
	w.Add("_pragma", "wal_autocheckpoint(0)")
	// The page cache stays at SQLite's 2 MiB: a 64 MiB one halved array
	// throughput (607 and 1,259 placements/s with it, 1,297 and 2,064 without), as
	// the profile put the loss in resetting the cache as a transaction began.
	// Statement and savepoint journals in memory: every multi-row INSERT
	// keeps one, and in a file each page it saves was a pwrite (14% of a
	// gang batch's CPU in the profile).
	w.Add("_pragma", "temp_store(MEMORY)")
	// Immediate transactions take the write lock at BEGIN, so a writer never
	// fails halfway with SQLITE_BUSY when it upgrades a read lock.
	w.Set("_txlock", "immediate")
	writer := sql.OpenDB(connector{d: d, dsn: base + "?" + w.Encode()})
	// One writer connection: SQLite has one writer anyway, and queueing in
	// the pool is cheaper and fairer than busy-waiting on the file lock.
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	writer.SetConnMaxLifetime(0)
	writer.SetConnMaxIdleTime(0)
	if err := writer.PingContext(ctx); err != nil {
		writer.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", cfg.Path, err)
	}

	r := common
	r.Add("_pragma", "query_only(1)")
	reader := sql.OpenDB(connector{d: d, dsn: base + "?" + r.Encode()})
	reader.SetMaxOpenConns(maxReaders)
	reader.SetMaxIdleConns(maxReaders)
	if err := reader.PingContext(ctx); err != nil {
		reader.Close()
		writer.Close()
		return nil, fmt.Errorf("sqlite: open reader %s: %w", cfg.Path, err)
	}
	cp := sql.OpenDB(connector{d: d, dsn: base + "?" + common.Encode()})
	cp.SetMaxOpenConns(1)
	d2 := &Driver{path: cfg.Path, writer: writer, reader: reader, checkpointer: cp, stop: make(chan struct{}), done: make(chan struct{}), release: release,
		wstmts: newStmtCache(writer), rstmts: newStmtCache(reader)}
	go d2.checkpoint()
	return d2, nil
}

// checkpoint copies committed WAL pages into the database file every
// interval. PASSIVE never waits for readers or the writer; it does what it
// can and the next round does the rest.
func (d *Driver) checkpoint() {
	defer close(d.done)
	t := time.NewTicker(checkpointInterval)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, _ = d.checkpointer.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)")
			cancel()
		}
	}
}

// connector opens connections through the private driver.
type connector struct {
	d   *msqlite.Driver
	dsn string
}

func (c connector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }

func (c connector) Driver() driver.Driver { return c.d }

// Dialect implements store.Driver.
func (d *Driver) Dialect() store.Dialect { return store.SQLite }

// SQLDB returns the single-writer handle.
func (d *Driver) SQLDB() *sql.DB { return d.writer }

// PgxPool returns nil: there is no PostgreSQL pool.
func (d *Driver) PgxPool() *pgxpool.Pool { return nil }

// SupportsListener is false: SQLite has no LISTEN/NOTIFY.
func (d *Driver) SupportsListener() bool { return false }

// Close closes the reader pool and the writer.
func (d *Driver) Close() error {
	close(d.stop)
	<-d.done
	// A last full checkpoint leaves the database file complete.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, cerr := d.checkpointer.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
	d.wstmts.close()
	d.rstmts.close()
	err := errors.Join(d.reader.Close(), cerr, d.checkpointer.Close(), d.writer.Close())
	d.release()
	return err
}

// Begin starts an immediate transaction on the writer, or a deferred
// read-only one on the reader pool. compute_now() needs nothing per
// transaction here: it reads the Go clock directly.
func (d *Driver) Begin(ctx context.Context, readOnly bool) (store.DriverTx, error) {
	db, cache := d.writer, d.wstmts
	if readOnly {
		db, cache = d.reader, d.rstmts
	}
	t, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: readOnly})
	if err != nil {
		return nil, err
	}
	return &tx{tx: t, cache: cache}, nil
}

// PrepareMigration does nothing: SQLite has no statement or lock bounds to
// lift (a writer waits on busy_timeout, the same for migrations).
func (d *Driver) PrepareMigration(context.Context, store.DriverTx) error { return nil }

// LockMigrations takes an exclusive lock on a file beside the database, so
// that handles opened by replicas (or processes) starting together install
// schemas one at a time. The store's own migrations would be safe without
// it (each runs in BEGIN IMMEDIATE and checks its version again), but
// River's migrator reads and applies in separate steps.
func (d *Driver) LockMigrations(ctx context.Context) (func(), error) {
	return lockFile(ctx, d.path+".migrate-lock")
}

// TableExists implements store.Driver.
func (d *Driver) TableExists(ctx context.Context, q store.Querier, table string) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = $1`, table).Scan(&n)
	return n > 0, err
}

// Classify maps SQLite result codes to the store's domain errors.
func (d *Driver) Classify(err error) error {
	if err == nil {
		return nil
	}
	var se *store.Error
	if errors.As(err, &se) {
		return err
	}
	if errors.Is(err, sql.ErrNoRows) {
		return &store.Error{Kind: store.ErrNotFound, Err: err}
	}
	var e *msqlite.Error
	if !errors.As(err, &e) {
		return err
	}
	code := e.Code()
	switch {
	case code == sqlite3.SQLITE_CONSTRAINT_UNIQUE || code == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return &store.Error{Kind: store.ErrUnique, Constraint: constraintName(e.Error()), Err: err}
	case code&0xff == sqlite3.SQLITE_CONSTRAINT:
		return &store.Error{Kind: store.ErrConstraint, Constraint: constraintName(e.Error()), Err: err}
	case code&0xff == sqlite3.SQLITE_BUSY || code&0xff == sqlite3.SQLITE_LOCKED:
		return &store.Error{Kind: store.ErrSerialization, Err: err}
	}
	return err
}

// constraintName pulls the constraint out of SQLite's message, e.g.
// "constraint failed: UNIQUE constraint failed: t.col (2067)" → "t.col",
// "CHECK constraint failed: positive" → "positive". For a trigger's
// RAISE(ABORT, msg) it is msg, the closest thing to a name there is.
func constraintName(msg string) string {
	if i := strings.LastIndex(msg, " ("); i >= 0 && strings.HasSuffix(msg, ")") {
		msg = msg[:i]
	}
	if i := strings.LastIndex(msg, "constraint failed: "); i >= 0 {
		msg = msg[i+len("constraint failed: "):]
	}
	return strings.TrimSpace(msg)
}
