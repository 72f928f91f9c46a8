package app

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"golang.org/x/mod/sumdb/note"

	"github.com/better-compute/better-compute/internal/audit"
	"github.com/better-compute/better-compute/internal/pki"
)

// buildAuditLog opens the audit log's Merkle tree and, with a sealing
// secret, its checkpoint key (created sealed on first start, named
// "<trust domain>/audit"). Without a secret the tree still grows but no
// checkpoint is signed.
func (a *App) buildAuditLog(ctx context.Context) error {
	cfg := audit.LogConfig{DB: a.DB, CheckpointEvery: a.cfg.AuditCheckpointEvery, CheckpointInterval: a.cfg.AuditCheckpointInterval,
		SequenceInterval: a.cfg.AuditSequenceInterval, Logger: a.cfg.Logger}
	if a.sealer != nil {
		td := pki.DefaultTrustDomain
		if a.PKI != nil {
			td = a.PKI.TrustDomain()
		}
		var (
			signer  note.Signer
			created bool
			err     error
		)
		signer, cfg.Verifier, created, err = audit.LoadOrInitSigner(ctx, a.DB, a.sealer, td+"/audit")
		if err != nil {
			return err
		}
		cfg.Signer = signer
		if created {
			a.cfg.Logger.Info("created the audit log's checkpoint key", "verifier_key", cfg.Verifier)
		}
	} else {
		a.cfg.Logger.Warn("no sealing secret: the audit log's tree grows but no checkpoint is signed")
	}
	l, err := audit.NewLog(cfg)
	if err != nil {
		return err
	}
	a.AuditLog = l
	return nil
}

type sequenceAuditArgs struct{}

func (sequenceAuditArgs) Kind() string { return "audit.sequence" }

// sequenceAuditWorker moves committed audit rows into the Merkle tree and
// signs the checkpoints that are due. Two runs at once are safe: each batch
// holds the tree row's lock (see audit.Log.Sequence).
type sequenceAuditWorker struct {
	river.WorkerDefaults[sequenceAuditArgs]
	log     *audit.Log
	metrics *jobMetrics
}

func (w *sequenceAuditWorker) Work(ctx context.Context, job *river.Job[sequenceAuditArgs]) error {
	_, err := w.log.Sequence(ctx)
	if err != nil {
		err = fmt.Errorf("audit sequence: %w", err)
	}
	return w.metrics.done(job.Kind, err)
}

func (w *sequenceAuditWorker) Timeout(*river.Job[sequenceAuditArgs]) time.Duration {
	return 5 * time.Minute
}

// addAuditJobs registers the sequencer, run every sequence interval and at
// start; unique by period so a slow run never has a queue behind it.
func (a *App) addAuditJobs(workers *river.Workers, jm *jobMetrics) []*river.PeriodicJob {
	river.AddWorker(workers, &sequenceAuditWorker{log: a.AuditLog, metrics: jm})
	every := a.AuditLog.Config().SequenceInterval
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(every),
		func() (river.JobArgs, *river.InsertOpts) {
			return sequenceAuditArgs{}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: every}}
		}, &river.PeriodicJobOpts{RunOnStart: true})}
}
