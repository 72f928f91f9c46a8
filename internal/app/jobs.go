package app

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
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
