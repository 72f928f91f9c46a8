package app

import (
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/capacity/views"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/providerpools"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
	"github.com/better-compute/better-compute/internal/webhooks"
)

// jobMetrics counts worked jobs by kind and outcome.
type jobMetrics struct{ total *prometheus.CounterVec }

func newJobMetrics(reg prometheus.Registerer) *jobMetrics {
	m := &jobMetrics{total: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bc_jobs_total", Help: "Background jobs worked, by kind and outcome.",
	}, []string{"kind", "outcome"})}
	reg.MustRegister(m.total)
	return m
}

func (m *jobMetrics) done(kind string, err error) error {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.total.WithLabelValues(kind, outcome).Inc()
	return err
}

// expireConfirmationWorker expires one confirmation at its deadline. It is
// level-triggered: a confirmation already used or expired is left alone.
type expireConfirmationWorker struct {
	river.WorkerDefaults[envelope.ExpireConfirmationArgs]
	db      *store.DB
	rec     envelope.Recorder
	metrics *jobMetrics
}

func (w *expireConfirmationWorker) Work(ctx context.Context, job *river.Job[envelope.ExpireConfirmationArgs]) error {
	return w.metrics.done(job.Kind, w.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		c, err := envelope.ConfirmationGet(ctx, tx, job.Args.ID)
		if err != nil {
			return err
		}
		expired, err := envelope.ConfirmationExpire(ctx, tx, c.ID)
		if err != nil || !expired {
			return err
		}
		return w.rec.InsertEvents(ctx, tx, []envelope.Event{{
			Type: "confirmation.expired", TenantID: c.TenantID, ResourceType: "Confirmation", ResourceID: c.ID, Time: w.db.Clock().Now(),
		}})
	}))
}

type pruneIdempotencyArgs struct{}

func (pruneIdempotencyArgs) Kind() string { return "idempotency.prune" }

// pruneIdempotencyWorker deletes expired idempotency keys.
type pruneIdempotencyWorker struct {
	river.WorkerDefaults[pruneIdempotencyArgs]
	db      *store.DB
	metrics *jobMetrics
}

func (w *pruneIdempotencyWorker) Work(ctx context.Context, job *river.Job[pruneIdempotencyArgs]) error {
	_, err := envelope.PruneIdempotencyKeys(ctx, w.db)
	return w.metrics.done(job.Kind, err)
}

// Capacity view upkeep: the rollup compaction and the usage rollup.
const (
	compactCapacityInterval = time.Minute
	rollupUsageInterval     = time.Hour
)

type compactCapacityArgs struct{}

func (compactCapacityArgs) Kind() string { return "capacity.compact" }

// compactCapacityWorker folds the capacity deltas into one row per key. It
// keeps every key's sums, so running it twice, or alongside bookings, is
// safe.
type compactCapacityWorker struct {
	river.WorkerDefaults[compactCapacityArgs]
	db      *store.DB
	metrics *jobMetrics
}

func (w *compactCapacityWorker) Work(ctx context.Context, job *river.Job[compactCapacityArgs]) error {
	return w.metrics.done(job.Kind, w.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return views.Compact(ctx, tx)
	}))
}

func (w *compactCapacityWorker) Timeout(*river.Job[compactCapacityArgs]) time.Duration {
	return time.Minute
}

type rollupUsageArgs struct{}

func (rollupUsageArgs) Kind() string { return "usage.rollup" }

// rollupUsageWorker writes the usage windows closed by now. The rollup is
// idempotent, so a retried or repeated run writes the same rows.
type rollupUsageWorker struct {
	river.WorkerDefaults[rollupUsageArgs]
	db      *store.DB
	rec     envelope.Recorder
	metrics *jobMetrics
}

func (w *rollupUsageWorker) Work(ctx context.Context, job *river.Job[rollupUsageArgs]) error {
	return w.metrics.done(job.Kind, w.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := usage.Rollup(ctx, tx, w.db.Clock().Now(), w.rec, providerpools.Intervals)
		return err
	}))
}

func (w *rollupUsageWorker) Timeout(*river.Job[rollupUsageArgs]) time.Duration {
	return 10 * time.Minute
}

// addCapacityViewJobs registers the capacity view workers and returns their
// periodic jobs: compaction every minute, the usage rollup every hour (and
// at start, so a restart catches up on the hours it missed).
func addCapacityViewJobs(workers *river.Workers, db *store.DB, rec envelope.Recorder, jm *jobMetrics) []*river.PeriodicJob {
	river.AddWorker(workers, &compactCapacityWorker{db: db, metrics: jm})
	river.AddWorker(workers, &rollupUsageWorker{db: db, rec: rec, metrics: jm})
	// Unique by period: a tick never piles up behind a slow run.
	unique := func(period time.Duration) *river.InsertOpts {
		return &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: period}}
	}
	return []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(compactCapacityInterval),
			func() (river.JobArgs, *river.InsertOpts) {
				return compactCapacityArgs{}, unique(compactCapacityInterval)
			}, nil),
		river.NewPeriodicJob(river.PeriodicInterval(rollupUsageInterval),
			func() (river.JobArgs, *river.InsertOpts) { return rollupUsageArgs{}, unique(rollupUsageInterval) },
			&river.PeriodicJobOpts{RunOnStart: true}),
	}
}

type pruneEventsArgs struct{}

func (pruneEventsArgs) Kind() string { return "events.prune" }

// pruneEventsWorker deletes outbox events past the retention window that
// every webhook cursor has passed.
type pruneEventsWorker struct {
	river.WorkerDefaults[pruneEventsArgs]
	db        *store.DB
	retention time.Duration
	metrics   *jobMetrics
}

func (w *pruneEventsWorker) Work(ctx context.Context, job *river.Job[pruneEventsArgs]) error {
	_, err := webhooks.PruneEvents(ctx, w.db, w.retention)
	return w.metrics.done(job.Kind, err)
}

// addWebhookJobs registers the delivery worker and the outbox retention
// job, and builds the dispatcher that feeds the workers.
func (a *App) addWebhookJobs(workers *river.Workers, jm *jobMetrics) []*river.PeriodicJob {
	var sealer webhooks.Sealer
	if a.sealer != nil {
		sealer = a.sealer
	}
	d := webhooks.NewDeliverer(a.DB, sealer, a.WebhookGuard, a.recorder, a.cfg.Logger)
	attempts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bc_webhook_delivery_attempts_total", Help: "Webhook delivery attempts, by outcome (ok or failed).",
	}, []string{"outcome"})
	a.Registry.MustRegister(attempts)
	d.Metrics = func(outcome string) { attempts.WithLabelValues(outcome).Inc() }
	river.AddWorker(workers, d)
	river.AddWorker(workers, &pruneEventsWorker{db: a.DB, retention: a.cfg.EventRetention, metrics: jm})
	a.Webhooks = &webhooks.Dispatcher{DB: a.DB, Hub: a.hub, Poll: a.cfg.EventPoll, Log: a.cfg.Logger,
		Enqueue: func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error {
			return a.Jobs.InsertTx(ctx, tx, args, opts)
		}}
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(time.Hour),
		func() (river.JobArgs, *river.InsertOpts) {
			return pruneEventsArgs{}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: time.Hour}}
		}, &river.PeriodicJobOpts{RunOnStart: true})}
}

// RunWebhooks runs the webhook dispatcher until ctx is done; without the
// worker role it only waits.
func (a *App) RunWebhooks(ctx context.Context) error {
	if !slices.Contains(a.cfg.Roles, RoleWorker) {
		<-ctx.Done()
		return nil
	}
	return a.Webhooks.Run(ctx)
}

// reconcileInstancesArgs asks every host holding instances which guests it
// runs (vps.InstanceService.SendLists), so lost guests and strays converge.
type reconcileInstancesArgs struct{}

func (reconcileInstancesArgs) Kind() string { return "instances.reconcile" }

type reconcileInstancesWorker struct {
	river.WorkerDefaults[reconcileInstancesArgs]
	// app: the instance service is built after the workers are registered.
	app     *App
	metrics *jobMetrics
}

func (w *reconcileInstancesWorker) Work(ctx context.Context, job *river.Job[reconcileInstancesArgs]) error {
	if w.app.Instances == nil {
		return nil
	}
	_, err := w.app.Instances.SendLists(ctx)
	return w.metrics.done(job.Kind, err)
}

// recreateInstanceArgs recreates one instance whose host was lost and whose
// policy asks for it (vps.InstanceService.Recreate): queued by the
// transaction that declared the host lost. recreateWaitingArgs is the
// periodic sweep that retries the instances still waiting for a host.
type recreateInstanceArgs struct {
	InstanceID string `json:"instance_id"`
}

func (recreateInstanceArgs) Kind() string { return "instances.recreate" }

type recreateWaitingArgs struct{}

func (recreateWaitingArgs) Kind() string { return "instances.recreate_waiting" }

type recreateInstanceWorker struct {
	river.WorkerDefaults[recreateInstanceArgs]
	app     *App
	metrics *jobMetrics
}

func (w *recreateInstanceWorker) Work(ctx context.Context, job *river.Job[recreateInstanceArgs]) error {
	if w.app.Instances == nil {
		return nil
	}
	return w.metrics.done(job.Kind, w.app.Instances.Recreate(ctx, job.Args.InstanceID))
}

type recreateWaitingWorker struct {
	river.WorkerDefaults[recreateWaitingArgs]
	app     *App
	metrics *jobMetrics
}

func (w *recreateWaitingWorker) Work(ctx context.Context, job *river.Job[recreateWaitingArgs]) error {
	if w.app.Instances == nil {
		return nil
	}
	_, err := w.app.Instances.RecreateWaiting(ctx)
	return w.metrics.done(job.Kind, err)
}

func (a *App) addRecreateJobs(workers *river.Workers, jm *jobMetrics) []*river.PeriodicJob {
	river.AddWorker(workers, &recreateInstanceWorker{app: a, metrics: jm})
	river.AddWorker(workers, &recreateWaitingWorker{app: a, metrics: jm})
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(vps.RecreateSweepInterval),
		func() (river.JobArgs, *river.InsertOpts) { return recreateWaitingArgs{}, nil }, nil)}
}

// queueRecreate inserts an instance's recreate job in the transaction
// that lost its host.
func (a *App) queueRecreate(ctx context.Context, tx store.Tx, instanceID string) error {
	return a.Jobs.InsertTx(ctx, tx, recreateInstanceArgs{InstanceID: instanceID}, &river.InsertOpts{MaxAttempts: 5})
}

// Sandbox sweeps: TTL expiry and the warm pool reconciler. Both are
// level-triggered, so a run that overlaps another, or repeats, is safe.
const (
	expireSandboxesInterval = 15 * time.Second
	reconcileWarmInterval   = 15 * time.Second
)

type expireSandboxesArgs struct{}

func (expireSandboxesArgs) Kind() string { return "sandbox.expire" }

type reconcileWarmArgs struct{}

func (reconcileWarmArgs) Kind() string { return "sandbox.warm" }

// The workers read App.Sandboxes at run time: jobs are registered before
// the envelope the sandbox service needs exists.
type expireSandboxesWorker struct {
	river.WorkerDefaults[expireSandboxesArgs]
	app     *App
	metrics *jobMetrics
}

func (w *expireSandboxesWorker) Work(ctx context.Context, job *river.Job[expireSandboxesArgs]) error {
	_, err := w.app.Sandboxes.ExpireDue(ctx)
	return w.metrics.done(job.Kind, err)
}

type reconcileWarmWorker struct {
	river.WorkerDefaults[reconcileWarmArgs]
	app     *App
	metrics *jobMetrics
}

func (w *reconcileWarmWorker) Work(ctx context.Context, job *river.Job[reconcileWarmArgs]) error {
	return w.metrics.done(job.Kind, w.app.Sandboxes.ReconcileWarm(ctx))
}

func (w *reconcileWarmWorker) Timeout(*river.Job[reconcileWarmArgs]) time.Duration {
	return 5 * time.Minute
}

func (a *App) addSandboxJobs(workers *river.Workers, jm *jobMetrics) []*river.PeriodicJob {
	river.AddWorker(workers, &expireSandboxesWorker{app: a, metrics: jm})
	river.AddWorker(workers, &reconcileWarmWorker{app: a, metrics: jm})
	return []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(expireSandboxesInterval),
			func() (river.JobArgs, *river.InsertOpts) { return expireSandboxesArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}),
		river.NewPeriodicJob(river.PeriodicInterval(reconcileWarmInterval),
			func() (river.JobArgs, *river.InsertOpts) { return reconcileWarmArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}),
	}
}
