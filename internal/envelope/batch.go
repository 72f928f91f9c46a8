package envelope

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// Batch is one transaction that commits many mutations together (group
// commit). Each mutation keeps its own decision, audit row, events and
// idempotency record; the batch stages them and Flush writes them with
// multi-row inserts before the committer commits.
type Batch struct {
	Tx     store.Tx
	env    *Envelope
	audits []AuditEntry
	events []Event
	idem   []idemRecord
}

// NewBatch starts a batch in tx.
func (e *Envelope) NewBatch(tx store.Tx) *Batch { return &Batch{Tx: tx, env: e} }

// BatchMark is a point in a batch to rewind to.
type BatchMark struct{ audits, events, idem int }

// Mark returns the batch's current end.
func (b *Batch) Mark() BatchMark { return BatchMark{len(b.audits), len(b.events), len(b.idem)} }

// Rewind drops what was staged after m: a mutation that failed leaves
// nothing behind.
func (b *Batch) Rewind(m BatchMark) {
	b.audits, b.events, b.idem = b.audits[:m.audits], b.events[:m.events], b.idem[:m.idem]
}

// Emit stages events of background work that runs in the batch's
// transaction (a placer's pending pass): they are written with the
// mutations' events, in one insert, and rewound with the work that emitted
// them.
func (b *Batch) Emit(evs ...Event) { b.events = append(b.events, evs...) }

// Len is how many mutations the batch holds (one audit row each).
func (b *Batch) Len() int { return len(b.audits) }

// Flush writes what is staged and empties the batch.
func (b *Batch) Flush(ctx context.Context) error {
	if len(b.audits) > 0 {
		if err := b.env.cfg.Recorder.InsertAudits(ctx, b.Tx, b.audits); err != nil {
			return err
		}
	}
	if len(b.events) > 0 {
		if err := b.env.cfg.Recorder.InsertEvents(ctx, b.Tx, b.events); err != nil {
			return err
		}
	}
	if err := idempotencyInsert(ctx, b.Tx, b.idem); err != nil {
		return err
	}
	b.audits, b.events, b.idem = b.audits[:0], b.events[:0], b.idem[:0]
	return nil
}

// CommitAlone runs a batch's write in a transaction of its own: what a
// Mutation.Submit does when there is no batch to join.
func (e *Envelope) CommitAlone(ctx context.Context, write func(ctx context.Context, b *Batch) error) error {
	return e.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		b := e.NewBatch(tx)
		if err := write(ctx, b); err != nil {
			return err
		}
		return b.Flush(ctx)
	})
}
