package provision

import (
	"context"
	"errors"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/store"
)

// AdvanceArgs runs Reconcile for one workflow. It is enqueued in the
// transaction of every change (immediately) and at every deadline, lease
// end and backoff (scheduled); repeats are harmless.
type AdvanceArgs struct {
	WorkflowID string `json:"workflow_id"`
}

// Kind is the job kind.
func (AdvanceArgs) Kind() string { return "provision.advance" }

// SweepArgs runs Sweep: the level-triggered safety net that finds every
// workflow with something due, whatever jobs were lost.
type SweepArgs struct{}

// Kind is the job kind.
func (SweepArgs) Kind() string { return "provision.sweep" }

// sweepBatch bounds one sweep's enqueue transaction.
const sweepBatch = 1000

type advanceWorker struct {
	river.WorkerDefaults[AdvanceArgs]
	e *Engine
}

// Timeout covers one dispatch and one lookup, each cut off at half the
// lease, and the transactions around them.
func (w *advanceWorker) Timeout(*river.Job[AdvanceArgs]) time.Duration {
	return w.e.cfg.Lease + time.Minute
}

func (w *advanceWorker) Work(ctx context.Context, job *river.Job[AdvanceArgs]) error {
	return w.e.Reconcile(ctx, job.Args.WorkflowID)
}

type sweepWorker struct {
	river.WorkerDefaults[SweepArgs]
	e *Engine
}

func (w *sweepWorker) Work(ctx context.Context, _ *river.Job[SweepArgs]) error {
	_, err := w.e.Sweep(ctx)
	return err
}

// AddWorkers registers the engine's jobs.
func (e *Engine) AddWorkers(workers *river.Workers) {
	river.AddWorker(workers, &advanceWorker{e: e})
	river.AddWorker(workers, &sweepWorker{e: e})
}

// PeriodicJobs is the sweep, run on the leader every SweepInterval and at
// start (so a restarted control plane picks up claims a dead worker left).
func (e *Engine) PeriodicJobs() []*river.PeriodicJob {
	every := e.cfg.SweepInterval
	opts := &river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: every}}
	return []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(every), func() (river.JobArgs, *river.InsertOpts) { return SweepArgs{}, opts },
			&river.PeriodicJobOpts{RunOnStart: true}),
	}
}

// Sweep enqueues an advance job for every workflow with something due now
// (by the engine's clock): not started, cancel requested, an in-flight step
// past its deadline or its claim's lease, or a step ready to claim. It
// returns how many it enqueued.
func (e *Engine) Sweep(ctx context.Context) (int, error) {
	n := 0
	err := e.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		ids, err := workflowsDue(ctx, tx, sweepBatch)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if err := e.enqueue(ctx, tx, id, time.Time{}); err != nil {
				return err
			}
		}
		n = len(ids)
		return nil
	})
	return n, err
}

// enqueue inserts an advance job in tx, to run at once (zero at) or at.
func (e *Engine) enqueue(ctx context.Context, tx store.Tx, id string, at time.Time) error {
	if e.cfg.Enqueue == nil {
		return errors.New("provision: no job inserter configured (Config.Enqueue)")
	}
	opts := &river.InsertOpts{MaxAttempts: 5}
	if !at.IsZero() {
		opts.ScheduledAt = at
	}
	return e.cfg.Enqueue(ctx, tx, AdvanceArgs{WorkflowID: id}, opts)
}
