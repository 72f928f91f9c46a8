// Package jobs runs Better Compute's background work on River: reconcilers,
// timers, webhook delivery, rollups and sweeps are River jobs, enqueued in
// the same transaction as the rows that call for them (InsertTx inside
// store.DB.Write), retried with backoff, coalesced by unique options, and
// scheduled periodically on the elected leader only.
//
// On PostgreSQL River uses the store's pgx pool (riverpgxv5) and
// LISTEN/NOTIFY; on SQLite it uses the store's single writer (riversqlite)
// and polls. Periodic jobs run only on the replica River elects leader, so a
// periodic job never runs twice for one tick across replicas.
//
// Unique jobs: pass &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs:
// true}} so that a repeat enqueue of the same kind and arguments (one pending
// reconcile per key) coalesces into the job already waiting.
//
// On SQLite River shares the store's single writer connection: a worker must
// not call db.Write while it holds a River transaction of its own (such as
// river.JobCompleteTx's), or the two wait for each other.
//
// It must never be a home-made queue, hold business rules, or write SQL of
// its own; job workers live with their modules.
package jobs

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/trace"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tracing"
)

// Config configures a Runtime; the zero value is an insert-only client.
type Config struct {
	// Worker runs job workers (the worker role). False makes an insert-only
	// client that only enqueues.
	Worker bool
	// Queues maps queue name to its maximum concurrent workers; default
	// {"default": 10}.
	Queues map[string]int
	// PollInterval is how often workers look for new jobs. SQLite has no
	// LISTEN, so it is the enqueue-to-start latency there; default 1s.
	PollInterval time.Duration
	// StopTimeout bounds how long Run waits for in-flight jobs to finish
	// after its context ends before cancelling them; default 30s.
	StopTimeout time.Duration
	// Logger receives River's logs, its INFO lines as DEBUG; default
	// slog.Default().
	Logger *slog.Logger
	// Tracing records a span per worked job, linked to the span that
	// enqueued it; nil records none (and adds nothing to job metadata).
	Tracing trace.TracerProvider
	// Clock is the control plane's clock. When it is simulated, River
	// schedules by it too, so a job due at a simulated time runs when the
	// simulation gets there.
	Clock clock.Clock
}

// riverTime adapts a simulated clock to River's time generator.
type riverTime struct{ clk clock.Clock }

func (r riverTime) Now() time.Time { return r.clk.Now() }

func (r riverTime) NowOrNil() *time.Time {
	t := r.clk.Now()
	return &t
}

// client hides River's generic transaction type (*sql.Tx or pgx.Tx).
type client interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	StopAndCancel(ctx context.Context) error
	insertTx(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

type riverClient[TTx any] struct {
	*river.Client[TTx]
}

func (c riverClient[TTx]) insertTx(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	raw, ok := tx.Raw().(TTx)
	if !ok {
		var want TTx
		return nil, fmt.Errorf("jobs: transaction is %T, River client wants %T", tx.Raw(), want)
	}
	return c.InsertTx(ctx, raw, args, opts)
}

// Runtime is River bound to a store.DB.
type Runtime struct {
	client client
	cfg    Config

	mu      sync.Mutex
	running bool
}

// New builds the River client for db's dialect. workers may be nil for an
// insert-only client; periodic jobs are ignored unless cfg.Worker is set,
// because only a working client can run them.
func New(db *store.DB, workers *river.Workers, periodic []*river.PeriodicJob, cfg Config) (*Runtime, error) {
	if cfg.Worker && workers == nil {
		return nil, errors.New("jobs: worker role needs workers")
	}
	cfg.PollInterval = cmp.Or(cfg.PollInterval, time.Second)
	cfg.StopTimeout = cmp.Or(cfg.StopTimeout, 30*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}

	rc := &river.Config{
		Logger:            quiet(cfg.Logger),
		Workers:           workers,
		FetchPollInterval: cfg.PollInterval,
		// River wants the cooldown no longer than the poll interval.
		FetchCooldown: min(river.FetchCooldownDefault, cfg.PollInterval),
		// Without LISTEN/NOTIFY River must poll instead of waiting for
		// notifications that never come.
		PollOnly: !db.SupportsListener(),
	}
	if cfg.Tracing != nil {
		rc.Middleware = []rivertype.Middleware{&traceMiddleware{tracer: tracing.Tracer(cfg.Tracing)}}
	}
	if cfg.Clock != nil && !clock.IsReal(cfg.Clock) {
		rc.Test.Time = riverTime{clk: cfg.Clock}
	}
	if cfg.Worker {
		queues := cfg.Queues
		if len(queues) == 0 {
			queues = map[string]int{river.QueueDefault: 10}
		}
		rc.Queues = map[string]river.QueueConfig{}
		for name, n := range queues {
			rc.Queues[name] = river.QueueConfig{MaxWorkers: n}
		}
		rc.PeriodicJobs = periodic
	}

	var c client
	switch db.Dialect() {
	case store.SQLite:
		rcl, err := river.NewClient[*sql.Tx](riversqlite.New(db.SQLDB()), rc)
		if err != nil {
			return nil, fmt.Errorf("jobs: new river client: %w", err)
		}
		c = riverClient[*sql.Tx]{rcl}
	case store.Postgres:
		rcl, err := river.NewClient[pgx.Tx](riverpgxv5.New(db.PgxPool()), rc)
		if err != nil {
			return nil, fmt.Errorf("jobs: new river client: %w", err)
		}
		c = riverClient[pgx.Tx]{rcl}
	default:
		return nil, fmt.Errorf("jobs: unsupported dialect %q", db.Dialect())
	}
	return &Runtime{client: c, cfg: cfg}, nil
}

// Migrations runs River's own migrations for db's dialect. It is idempotent;
// call it after db.Migrate.
func Migrations(ctx context.Context, db *store.DB) error {
	// rivermigrate takes no lock of its own; replicas starting together
	// would race to create the same tables.
	err := db.WithMigrationLock(ctx, func(ctx context.Context) error {
		switch db.Dialect() {
		case store.SQLite:
			return migrate[*sql.Tx](ctx, riversqlite.New(db.SQLDB()))
		case store.Postgres:
			return migrate[pgx.Tx](ctx, riverpgxv5.New(db.PgxPool()))
		default:
			return fmt.Errorf("unsupported dialect %q", db.Dialect())
		}
	})
	if err != nil {
		return fmt.Errorf("jobs: river migrations: %w", err)
	}
	return nil
}

func migrate[TTx any](ctx context.Context, d riverdriver.Driver[TTx]) error {
	m, err := rivermigrate.New[TTx](d, &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

// InsertTx enqueues a job inside the caller's transaction, so the job
// commits or rolls back with the caller's rows. A repeat of a unique job
// (opts.UniqueOpts) is coalesced into the waiting one without error.
func (r *Runtime) InsertTx(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error {
	_, err := r.InsertTxResult(ctx, tx, args, opts)
	return err
}

// InsertTxResult is InsertTx that also returns River's result, which tells
// whether a unique job was skipped as a duplicate.
func (r *Runtime) InsertTxResult(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	res, err := r.client.insertTx(ctx, tx, args, opts)
	if err != nil {
		return nil, fmt.Errorf("jobs: insert %s: %w", args.Kind(), err)
	}
	return res, nil
}

// Run works jobs until ctx is done when the runtime has the worker role,
// then stops gracefully: in-flight jobs get cfg.StopTimeout to finish before
// their contexts are cancelled. Without the worker role it only waits for
// ctx. It returns nil after a clean stop; a second concurrent Run fails.
func (r *Runtime) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return errors.New("jobs: runtime already running")
	}
	r.running = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running = false
		r.mu.Unlock()
	}()

	if !r.cfg.Worker {
		<-ctx.Done()
		return nil
	}
	// Start on a context that outlives ctx: cancelling River's start context
	// is a hard stop that cancels in-flight jobs, and we want a soft one.
	if err := r.client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("jobs: start: %w", err)
	}
	<-ctx.Done()

	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StopTimeout)
	defer cancel()
	if err := r.client.Stop(stopCtx); err == nil {
		return nil
	}
	// Jobs outlived the grace period: cancel them and wait a little more.
	hardCtx, cancelHard := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StopTimeout)
	defer cancelHard()
	if err := r.client.StopAndCancel(hardCtx); err != nil {
		return fmt.Errorf("jobs: stop: %w", err)
	}
	return nil
}
