package webhooks

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/store"
)

// Waker wakes the dispatcher when events commit in this process (the
// outbox hub).
type Waker interface {
	Wait() <-chan struct{}
}

// Dispatcher is the outbox consumer: it reads each enabled endpoint's
// events after its cursor, queues a delivery for each that matches its
// types and moves the cursor, enqueueing the endpoint's delivery job in the
// same transaction; and it enqueues the jobs of endpoints whose retry has
// come due on the control plane's clock.
type Dispatcher struct {
	DB      *store.DB
	Hub     Waker
	Enqueue func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error
	// Poll is how often it looks for other replicas' events and due
	// retries; default 1s.
	Poll time.Duration
	Log  *slog.Logger
}

// Run dispatches until ctx is done.
func (d *Dispatcher) Run(ctx context.Context) error {
	t := time.NewTicker(cmp.Or(d.Poll, time.Second))
	defer t.Stop()
	for {
		wake := d.Hub.Wait()
		if err := d.Once(ctx); err != nil && ctx.Err() == nil {
			d.Log.Warn("webhook dispatch", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-t.C:
		}
	}
}

// Once runs one pass over every enabled endpoint.
func (d *Dispatcher) Once(ctx context.Context) error {
	var ids []string
	if err := d.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		ids, err = WebhookIDsEnabled(ctx, tx)
		return err
	}); err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		for {
			more, err := d.dispatch(ctx, id)
			if err != nil {
				errs = append(errs, err)
			}
			if err != nil || !more {
				break
			}
		}
	}
	var due []string
	if err := d.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		due, err = DeliveryDueWebhooks(ctx, tx, d.DB.Clock().Now())
		return err
	}); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if len(due) > 0 {
		errs = append(errs, d.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			for _, id := range due {
				if err := d.Enqueue(ctx, tx, DeliverArgs{WebhookID: id}, DeliverOpts()); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	return errors.Join(errs...)
}

const dispatchBatch = 500

// dispatch moves one endpoint's cursor over up to dispatchBatch events.
func (d *Dispatcher) dispatch(ctx context.Context, id string) (more bool, err error) {
	err = d.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		w, err := WebhookLock(ctx, tx, id)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil || w.State != StateEnabled {
			return err
		}
		evs, err := events.ListAfter(ctx, tx, w.TenantID, false, w.Cursor, dispatchBatch)
		if errors.Is(err, events.ErrUnknownCursor) {
			// The cursor's event was pruned (it never is while an
			// endpoint stands on it, but a restore could do it): resume
			// from the outbox's end rather than stall forever.
			last, lerr := events.LastSeq(ctx, tx)
			if lerr != nil {
				return lerr
			}
			return WebhookSetCursor(ctx, tx, w.ID, last)
		}
		if err != nil || len(evs) == 0 {
			return err
		}
		now := d.DB.Clock().Now()
		queued := false
		for _, ev := range evs {
			if !Matches(ev.Type, w.Types) {
				continue
			}
			dID := envelope.NewID(DeliveryIDPrefix, now)
			payload, err := CloudEvent(ev, dID)
			if err != nil {
				return err
			}
			dl := Delivery{ID: dID, WebhookID: w.ID, TenantID: w.TenantID, EventID: payload2ID(ev), EventType: ev.Type,
				Payload: payload, State: DeliveryPending, NextAttemptTime: now, CreateTime: now, UpdateTime: now}
			if err := DeliveryInsert(ctx, tx, &dl); err != nil {
				return err
			}
			queued = true
		}
		if err := WebhookSetCursor(ctx, tx, w.ID, evs[len(evs)-1].Seq); err != nil {
			return err
		}
		more = len(evs) == dispatchBatch
		if queued {
			return d.Enqueue(ctx, tx, DeliverArgs{WebhookID: w.ID}, DeliverOpts())
		}
		return nil
	})
	return more, err
}

func payload2ID(ev events.Stored) string { return events.Proto(ev).GetId() }

// PruneEvents deletes outbox events older than retention that every
// endpoint's cursor has passed; it returns how many.
func PruneEvents(ctx context.Context, db *store.DB, retention time.Duration) (int64, error) {
	var n int64
	err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		minCursor, any, err := WebhookMinCursor(ctx, tx)
		if err != nil {
			return err
		}
		keep := int64(-1) // no endpoint: no cursor holds events back
		if any {
			keep = minCursor
		}
		n, err = events.Prune(ctx, tx, db.Clock().Now().Add(-retention), keep)
		return err
	})
	return n, err
}
