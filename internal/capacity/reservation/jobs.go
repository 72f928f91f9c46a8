package reservation

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/riverqueue/river"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// Runner runs the engine's own transactions: the queued placer, the tick
// that starts, expires and re-binds reservations, and the fleet hooks.
type Runner struct {
	DB     *store.DB
	Rec    envelope.Recorder
	Engine *Engine
	Log    *slog.Logger
	// TickInterval is how often the tick runs; default 5s.
	TickInterval time.Duration
	// Batch is the most pending reservations one placer transaction looks
	// at; default 200.
	Batch int
}

func (rn *Runner) record(ctx context.Context, tx store.Tx, evs []envelope.Event) error {
	if len(evs) == 0 {
		return nil
	}
	now := rn.Engine.placers.Clock.Now()
	for i := range evs {
		if evs[i].Time.IsZero() {
			evs[i].Time = now
		}
	}
	return rn.Rec.InsertEvents(ctx, tx, evs)
}

// PlacePendingArgs wakes the queued placer for one pool.
type PlacePendingArgs struct {
	PoolID string `json:"pool_id"`
}

// Kind is the job kind.
func (PlacePendingArgs) Kind() string { return "capacity.place_pending" }

// TickArgs runs the periodic tick.
type TickArgs struct{}

// Kind is the job kind.
func (TickArgs) Kind() string { return "capacity.tick" }

// ReconcileAllArgs reconciles every node (a safety net for missed hooks).
type ReconcileAllArgs struct{}

// Kind is the job kind.
func (ReconcileAllArgs) Kind() string { return "capacity.reconcile_all" }

// ArchiveBookingsArgs moves ended bookings to the archive tables.
type ArchiveBookingsArgs struct{}

// Kind is the job kind.
func (ArchiveBookingsArgs) Kind() string { return "capacity.archive_bookings" }

// ArchiveAfter is how long a booking stays in the live tables after it
// ends: well past the tick that expires its reservation, so the rollups
// never miss a live reservation's bookings.
const ArchiveAfter = 24 * time.Hour

// archiveBatch bounds one archive transaction.
const archiveBatch = 10000

type archiveWorker struct {
	river.WorkerDefaults[ArchiveBookingsArgs]
	rn *Runner
}

func (w *archiveWorker) Work(ctx context.Context, _ *river.Job[ArchiveBookingsArgs]) error {
	_, err := w.rn.ArchiveBookings(ctx)
	return err
}

// ArchiveBookings moves bookings that ended more than ArchiveAfter ago to
// the archive, in bounded transactions, so history never slows booking.
func (rn *Runner) ArchiveBookings(ctx context.Context) (int, error) {
	before := rn.Engine.placers.Clock.Now().Add(-ArchiveAfter)
	total := 0
	for {
		var n int
		if err := rn.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			var err error
			n, err = booking.Archive(ctx, tx, before, archiveBatch)
			return err
		}); err != nil {
			return total, err
		}
		total += n
		if n < archiveBatch {
			return total, nil
		}
	}
}

type placeWorker struct {
	river.WorkerDefaults[PlacePendingArgs]
	rn *Runner
}

func (w *placeWorker) Work(ctx context.Context, job *river.Job[PlacePendingArgs]) error {
	_, err := w.rn.PlacePending(ctx, job.Args.PoolID)
	return err
}

type tickWorker struct {
	river.WorkerDefaults[TickArgs]
	rn *Runner
}

func (w *tickWorker) Work(ctx context.Context, _ *river.Job[TickArgs]) error { return w.rn.Tick(ctx) }

type reconcileWorker struct {
	river.WorkerDefaults[ReconcileAllArgs]
	rn *Runner
}

func (w *reconcileWorker) Work(ctx context.Context, _ *river.Job[ReconcileAllArgs]) error {
	return w.rn.ReconcileAll(ctx)
}

// AddWorkers registers the capacity jobs.
func (rn *Runner) AddWorkers(workers *river.Workers) {
	river.AddWorker(workers, &placeWorker{rn: rn})
	river.AddWorker(workers, &tickWorker{rn: rn})
	river.AddWorker(workers, &reconcileWorker{rn: rn})
	river.AddWorker(workers, &archiveWorker{rn: rn})
}

// TickEvery is the tick's interval: TickInterval, or 5 s.
func (rn *Runner) TickEvery() time.Duration {
	if rn.TickInterval <= 0 {
		return 5 * time.Second
	}
	return rn.TickInterval
}

// PeriodicJobs are the tick and the reconcile sweep; River runs them on the
// leader only.
func (rn *Runner) PeriodicJobs() []*river.PeriodicJob {
	every := rn.TickEvery()
	tick := &river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: every}}
	sweep := &river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: 5 * time.Minute}}
	return []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(every), func() (river.JobArgs, *river.InsertOpts) { return TickArgs{}, tick }, nil),
		river.NewPeriodicJob(river.PeriodicInterval(5*time.Minute), func() (river.JobArgs, *river.InsertOpts) { return ReconcileAllArgs{}, sweep },
			&river.PeriodicJobOpts{RunOnStart: true}),
		river.NewPeriodicJob(river.PeriodicInterval(time.Hour), func() (river.JobArgs, *river.InsertOpts) {
			return ArchiveBookingsArgs{}, &river.InsertOpts{MaxAttempts: 3, UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: time.Hour}}
		}, nil),
	}
}

// ReconcileAll reconciles every tenant's nodes.
func (rn *Runner) ReconcileAll(ctx context.Context) error {
	var tenants []string
	if err := rn.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		tenants, err = nodeTenants(ctx, tx)
		return err
	}); err != nil {
		return err
	}
	for _, t := range tenants {
		if err := rn.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			return rn.Engine.Reconciler.Sweep(ctx, tx, t)
		}); err != nil {
			return err
		}
	}
	return nil
}

func (rn *Runner) batch() int {
	if rn.Batch <= 0 {
		return 200
	}
	return rn.Batch
}

// PlacePending places a pool's pending reservations, oldest first, in one
// transaction: each under its own savepoint, so one that does not fit (or
// would exceed a quota) stays pending without undoing the others. A
// reservation asked for a length keeps its length: its window moves to now.
func (rn *Runner) PlacePending(ctx context.Context, poolID string) (int, error) {
	e := rn.Engine
	if here, _, err := e.placers.Claim(ctx, poolID); err != nil || !here {
		// Another replica places this pool, and runs its queue itself.
		if errors.Is(err, placer.ErrNotOwner) {
			err = nil
		}
		return 0, err
	}
	placed := 0
	err := e.placers.Submit(ctx, poolID, true, func(ctx context.Context, b *placer.Batch) error {
		placed = 0
		now := b.Now()
		tx := b.Tx()
		// A releasing reservation whose end came first gets its step (or
		// ends) in this batch, before anything is placed: its pods may
		// still hold the devices, and a wake that ran before the tick must
		// not book them under the pods.
		var evs []envelope.Event
		held, err := releasingDue(ctx, tx, poolID, now)
		if err != nil {
			return err
		}
		for i := range held {
			more, err := e.heldAtEnd(ctx, b, &held[i], now)
			if err != nil {
				return err
			}
			evs = append(evs, more...)
		}
		rs, err := pendingForUpdate(ctx, tx, poolID, rn.batch())
		if err != nil {
			return err
		}
		sortByCreate(rs)
		for i := range rs {
			r := &rs[i]
			if !r.EndsAt.After(now) {
				more, err := e.end(ctx, tx, r, StateExpired, "NeverPlaced", now)
				if err != nil {
					return err
				}
				evs = append(evs, more...)
				continue
			}
			// A window that began while it waited moves to now, keeping its
			// length — only if it is placed now; otherwise it keeps its
			// window, and expires at its end.
			origStart, origEnd := r.StartsAt, r.EndsAt
			if r.StartsAt.Before(now) {
				d := r.EndsAt.Sub(r.StartsAt)
				r.StartsAt = now.UTC().Truncate(time.Microsecond)
				r.EndsAt = r.StartsAt.Add(d)
			}
			var ok bool
			var ex placement.Explanation
			// The tenant's quotas are held before the savepoint, whose
			// rollback would let go of them.
			if err := b.LockTenant(ctx, r.TenantID); err != nil {
				return err
			}
			m := b.Mark()
			err := placer.Savepoint(ctx, tx, "pending", func() error {
				var err error
				if ok, ex, err = e.placers.Place(ctx, b, r, now); err != nil || !ok {
					return err
				}
				return b.CheckQuota(ctx, charge(r))
			})
			if err != nil {
				// Its bookings, marks and charge go with the savepoint.
				b.Rewind(m)
			}
			var apiErr *envelope.Error
			switch {
			case errors.As(err, &apiErr) && apiErr.Code == envelope.CodeQuotaExceeded:
				ok = false
				r.NodeID, r.GPUModel, r.Placement = "", "", PlacementRecord{NUMA: -1, Island: -1}
				r.Explanation = explanationJSON(&apiv1.Explanation{Summary: apiErr.Message})
			case err != nil:
				var re *placement.RequestError
				if errors.As(err, &re) {
					more, err := e.end(ctx, tx, r, StateFailed, "InvalidRequest", now)
					if err != nil {
						return err
					}
					evs = append(evs, more...)
					continue
				}
				return err
			case !ok:
				r.Explanation = explanationJSON(placer.ExplanationProto(ex))
			}
			if !ok {
				r.StartsAt, r.EndsAt = origStart, origEnd
			}
			r.UpdateTime = now
			if ok {
				more, err := e.held(ctx, b, r, now)
				if err != nil {
					return err
				}
				evs = append(evs, more...)
				placed++
			}
			saved, err := save(ctx, tx, r, StatePending)
			if err != nil {
				return err
			}
			if !saved {
				return errMoved(false)
			}
		}
		return b.Emit(evs...)
	})
	return placed, err
}

// Tick starts reservations whose window began, expires those whose window
// ended, and re-sends or fails binds past their deadline. Then it places
// what waits.
func (rn *Runner) Tick(ctx context.Context) error {
	e := rn.Engine
	var due, pending []string
	if err := rn.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		if due, err = duePools(ctx, tx, e.placers.Clock.Now()); err != nil {
			return err
		}
		pending, err = pendingPools(ctx, tx)
		return err
	}); err != nil {
		return err
	}
	for _, p := range due {
		if err := rn.TickPool(ctx, p); err != nil {
			return err
		}
	}
	for _, p := range pending {
		if _, err := rn.PlacePending(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// TickPool starts, expires and times out the binds of one pool's due
// reservations, in its placer: a transition never races the pool's
// placements. Another replica's pool is left to it (its owner ticks it).
func (rn *Runner) TickPool(ctx context.Context, poolID string) error {
	e := rn.Engine
	if here, _, err := e.placers.Claim(ctx, poolID); err != nil || !here {
		if errors.Is(err, placer.ErrNotOwner) {
			err = nil
		}
		return err
	}
	return e.placers.Submit(ctx, poolID, true, func(ctx context.Context, b *placer.Batch) error {
		tx, now := b.Tx(), b.Now()
		rs, err := duePool(ctx, tx, poolID, now)
		if err != nil {
			return err
		}
		var evs []envelope.Event
		for i := range rs {
			r := &rs[i]
			from := r.State
			var more []envelope.Event
			switch {
			case r.State == StateReleasing:
				// Its end came while the node's pods may hold its devices.
				more, err = e.heldAtEnd(ctx, b, r, now)
			case !r.EndsAt.After(now):
				more, err = e.end(ctx, tx, r, StateExpired, "Expired", now)
				if err == nil && r.State == StateReleasing {
					// A kubernetes binding's end: the pods have had no
					// allocation.release yet, so they hold the devices.
					var held []envelope.Event
					held, err = e.heldAtEnd(ctx, b, r, now)
					more = append(more, held...)
				}
			case r.State == StatePlaced:
				if more, err = e.startIfDue(ctx, tx, r, now); err == nil {
					err = saveMoved(ctx, tx, r, from, now)
				}
			case r.State == StateBinding:
				more, err = e.bindTimedOut(ctx, tx, r, now)
			}
			if err != nil {
				return err
			}
			evs = append(evs, more...)
		}
		return b.Emit(evs...)
	})
}

func saveMoved(ctx context.Context, tx store.Tx, r *Reservation, from string, now time.Time) error {
	r.UpdateTime = now
	ok, err := save(ctx, tx, r, from)
	if err != nil {
		return err
	}
	return errMoved(ok)
}

// bindTimedOut re-sends a bind past its deadline, or fails the reservation
// after BindAttempts.
func (e *Engine) bindTimedOut(ctx context.Context, tx store.Tx, r *Reservation, now time.Time) ([]envelope.Event, error) {
	if r.Binding == BindingMachine {
		if c, ok := r.Condition(CondMachineLease); ok && c.Reason == "NotLeasable" {
			return e.end(ctx, tx, r, StateFailed, "MachineNotLeasable", now)
		}
		r.SetCondition(Condition{Type: CondBindTimeout, Status: "true", Reason: "LeaseNotAccepted",
			Message: "the lessee did not accept the machine lease in time", UpdateTime: now})
		return e.end(ctx, tx, r, StateFailed, "LeaseNotAccepted", now)
	}
	r.SetCondition(Condition{Type: CondBindTimeout, Status: "true", Reason: "NoAllocationBound",
		Message: "the node did not confirm allocation.bind in time", UpdateTime: now})
	if r.BindAttempts >= e.bindAttempts() {
		return e.end(ctx, tx, r, StateFailed, "BindTimeout", now)
	}
	evs, err := e.sendBind(ctx, tx, r, now)
	if err != nil {
		return nil, err
	}
	return evs, saveMoved(ctx, tx, r, StateBinding, now)
}

// maxIsolatedMessage bounds the Isolated condition's message: the node's
// details are free text.
const maxIsolatedMessage = 2048

func sortByCreate(rs []Reservation) {
	slices.SortStableFunc(rs, func(a, b Reservation) int {
		return cmp.Or(a.CreateTime.Compare(b.CreateTime), cmp.Compare(a.ID, b.ID))
	})
}
