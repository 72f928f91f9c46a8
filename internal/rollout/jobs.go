package rollout

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/store"
)

// ControlArgs runs Control: periodically on the leader, and queued when a
// rollout's command ends or an operator resumes one.
type ControlArgs struct{}

// Kind is the job kind.
func (ControlArgs) Kind() string { return "rollout.control" }

type controlWorker struct {
	river.WorkerDefaults[ControlArgs]
	m *Module
}

func (w *controlWorker) Work(ctx context.Context, _ *river.Job[ControlArgs]) error {
	_, err := w.m.Control(ctx)
	return err
}

// AddWorkers registers the controller's job.
func (m *Module) AddWorkers(workers *river.Workers) {
	river.AddWorker(workers, &controlWorker{m: m})
}

// PeriodicJobs is the controller's period, on the leader.
func (m *Module) PeriodicJobs() []*river.PeriodicJob {
	every := max(m.cfg.Interval, time.Second)
	if m.cfg.Interval <= 0 {
		every = 10 * time.Second
	}
	opts := &river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: every}}
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(every),
		func() (river.JobArgs, *river.InsertOpts) { return ControlArgs{}, opts }, &river.PeriodicJobOpts{RunOnStart: true})}
}

// CommandDone wakes the controller when one of its commands ends, in the
// transaction that records the end.
func (m *Module) CommandDone(ctx context.Context, tx store.Tx, kind string) error {
	if kind != KindUpgrade && kind != KindRollback {
		return nil
	}
	return m.wake(ctx, tx)
}
