package health

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// ReconcileArgs runs Reconcile: queued by every change that gives the
// reconciler work, and periodically as the level-triggered safety net.
type ReconcileArgs struct{}

// Kind is the job kind.
func (ReconcileArgs) Kind() string { return "health.reconcile" }

type reconcileWorker struct {
	river.WorkerDefaults[ReconcileArgs]
	m *Module
}

func (w *reconcileWorker) Work(ctx context.Context, _ *river.Job[ReconcileArgs]) error {
	_, err := w.m.Reconcile(ctx)
	return err
}

// AddWorkers registers the reconciler's job.
func (m *Module) AddWorkers(workers *river.Workers) {
	river.AddWorker(workers, &reconcileWorker{m: m})
}

// PeriodicJobs is the reconciler's period, on the leader.
func (m *Module) PeriodicJobs() []*river.PeriodicJob {
	every := m.cfg.Interval
	if every <= 0 {
		every = 15 * time.Second
	}
	// River's unique jobs count periods in whole seconds.
	every = max(every, time.Second)
	opts := &river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: every}}
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(every),
		func() (river.JobArgs, *river.InsertOpts) { return ReconcileArgs{}, opts }, &river.PeriodicJobOpts{RunOnStart: true})}
}

// CommandDone wakes the reconciler when a node with a remediation waiting
// for its drain acknowledges the drain, in the transaction that records it.
func (m *Module) CommandDone(ctx context.Context, tx store.Tx, nodeID, kind, state string) error {
	if kind != fleet.KindNodeDrain || state != fleet.CommandSucceeded {
		return nil
	}
	r, ok, err := ActiveRemediation(ctx, tx, nodeID)
	if err != nil || !ok || r.State != RemDraining {
		return err
	}
	return m.wake(ctx, tx)
}
