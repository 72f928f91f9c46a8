package reservation

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/riverqueue/river"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/capacity/pool"
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
	now := rn.Engine.Clock.Now()
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
	before := rn.Engine.Clock.Now().Add(-ArchiveAfter)
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
	if here, _, err := e.Claim(ctx, poolID); err != nil || !here {
		// Another replica places this pool, and runs its queue itself.
		if errors.Is(err, placer.ErrNotOwner) {
			err = nil
		}
		return 0, err
	}
	placed := 0
	err := e.Submit(ctx, poolID, true, func(ctx context.Context, b *placer.Batch) error {
		placed = 0
		now := b.Now()
		tx := b.Tx()
		rs, err := pendingForUpdate(ctx, tx, poolID, rn.batch())
		if err != nil {
			return err
		}
		sortByCreate(rs)
		var evs []envelope.Event
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
				if ok, ex, err = e.Place(ctx, b, r, now); err != nil || !ok {
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
		return rn.record(ctx, tx, evs)
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
		if due, err = duePools(ctx, tx, e.Clock.Now()); err != nil {
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
	if here, _, err := e.Claim(ctx, poolID); err != nil || !here {
		if errors.Is(err, placer.ErrNotOwner) {
			err = nil
		}
		return err
	}
	return e.Submit(ctx, poolID, true, func(ctx context.Context, b *placer.Batch) error {
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
			case !r.EndsAt.After(now):
				more, err = e.end(ctx, tx, r, StateExpired, "Expired", now)
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
		return rn.record(ctx, tx, evs)
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

// Hooks is what the gateway calls in its transactions (gateway.Hooks) and
// what pools call when they change (pool.ChangeHook).
type Hooks struct{ rn *Runner }

// Hooks returns the runner's hooks.
func (rn *Runner) Hooks() Hooks { return Hooks{rn: rn} }

// PoolChanged reconciles the tenant's nodes against its pools. poolID is
// the pool created or updated ("" for an archive): a change that would put
// nodes into conflict is refused.
func (h Hooks) PoolChanged(ctx context.Context, tx store.Tx, tenantID, poolID string) error {
	if poolID == "" {
		return h.rn.Engine.Reconciler.ReconcileTenant(ctx, tx, tenantID)
	}
	return h.rn.Engine.Reconciler.ReconcilePool(ctx, tx, tenantID, poolID)
}

// NodeChanged reconciles a node whose inventory or device health changed.
func (h Hooks) NodeChanged(ctx context.Context, tx store.Tx, nodeID string) error {
	return h.rn.Engine.Reconciler.ReconcileNode(ctx, tx, nodeID)
}

// AllocationBound makes a binding reservation active: the node applied its
// limits. What the node enforces is kept as the Isolated condition.
func (h Hooks) AllocationBound(ctx context.Context, tx store.Tx, nodeID string, b *agentv1.AllocationBound) error {
	allocationID := b.GetAllocationId()
	if !envelope.IsID(allocationID, IDPrefix) {
		return nil // another module's allocation
	}
	r, err := getForUpdate(ctx, tx, allocationID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || r.State != StateBinding || r.NodeID != nodeID {
		return err
	}
	now := h.rn.Engine.Clock.Now()
	evs := h.rn.Engine.activate(&r, now)
	r.SetCondition(Condition{Type: CondDevicesHeld, Status: "true", Reason: "Bound", Message: "limits applied at " + b.GetCgroup(), UpdateTime: now})
	r.SetCondition(Condition{Type: CondBindTimeout, Status: "false", Reason: "Bound", Message: "the node confirmed the bind", UpdateTime: now})
	r.SetCondition(isolated(b.GetEnforced(), now))
	if err := saveMoved(ctx, tx, &r, StateBinding, now); err != nil {
		return err
	}
	return h.rn.record(ctx, tx, evs)
}

// maxIsolatedMessage bounds the Isolated condition's message: the node's
// details are free text.
const maxIsolatedMessage = 2048

// isolated is the Isolated condition for what a node reported enforcing:
// true when the devices are confined by the kernel, false otherwise (not
// applied, not reported by an older bcd, or only simulated), with each
// resource's state and detail in the message.
func isolated(enforced []*agentv1.Enforcement, now time.Time) Condition {
	c := Condition{Type: CondIsolated, Status: "false", Reason: "NotReported",
		Message: "the node did not report what it enforces", UpdateTime: now}
	var parts []string
	for _, e := range enforced {
		st := strings.ToLower(strings.TrimPrefix(e.GetState().String(), "ENFORCEMENT_STATE_"))
		parts = append(parts, fmt.Sprintf("%s: %s (%s)", e.GetResource(), st, e.GetDetail()))
		if e.GetResource() != "devices" {
			continue
		}
		switch e.GetState() {
		case agentv1.EnforcementState_ENFORCEMENT_STATE_APPLIED:
			c.Status, c.Reason = "true", "DevicesConfined"
		case agentv1.EnforcementState_ENFORCEMENT_STATE_SIMULATED:
			c.Reason = "Simulated"
		default:
			c.Reason = "DevicesNotConfined"
		}
	}
	if len(parts) > 0 {
		c.Message = strings.Join(parts, "; ")
		if len(c.Message) > maxIsolatedMessage {
			c.Message = c.Message[:maxIsolatedMessage] + "…"
		}
	}
	return c
}

// AllocationReleased records the node's confirmation of a release: it
// killed what was left in the reservation's cgroup and removed it.
func (h Hooks) AllocationReleased(ctx context.Context, tx store.Tx, nodeID string, rel *agentv1.AllocationReleased) error {
	if !envelope.IsID(rel.GetAllocationId(), IDPrefix) {
		return nil
	}
	r, err := getForUpdate(ctx, tx, rel.GetAllocationId())
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || r.NodeID != nodeID {
		return err
	}
	now := h.rn.Engine.Clock.Now()
	if !r.SetCondition(Condition{Type: CondNodeReleased, Status: "true", Reason: "Released",
		Message: fmt.Sprintf("the node killed %d leftover processes and removed the cgroup", rel.GetKilledProcesses()), UpdateTime: now}) {
		return nil
	}
	return saveMoved(ctx, tx, &r, r.State, now)
}

// NodeCapabilitiesChanged makes the node's pool read its nodes again: the
// index holds each node's capabilities, which placement checks (a node
// that no longer advertises devices.limits takes no binding-node work).
func (h Hooks) NodeCapabilitiesChanged(ctx context.Context, tx store.Tx, nodeID string) error {
	return h.NodesStateChanged(ctx, tx, []string{nodeID})
}

// NodesStateChanged makes the pools of nodes that started or stopped taking
// work (drained, undrained, gone unreachable, back) read those nodes again:
// each node's pool version moves, with the node as its delta, so the pool's
// placer re-reads the node instead of keeping what it last knew.
func (h Hooks) NodesStateChanged(ctx context.Context, tx store.Tx, nodeIDs []string) error {
	for _, id := range nodeIDs {
		var poolID string
		err := nodePool(ctx, tx, id).Scan(&poolID)
		if errors.Is(err, store.ErrNotFound) || (err == nil && poolID == "") {
			continue
		}
		if err != nil {
			return err
		}
		v, err := atoms.BumpPoolVersionOf(ctx, tx, poolID)
		if err != nil {
			return err
		}
		h.rn.Engine.NodeChanged(tx, poolID, id, v)
	}
	return nil
}

// NodesLost marks the reservations of lost nodes NodeLost and, per their
// pool's policy, releases them or puts them back in the queue.
func (h Hooks) NodesLost(ctx context.Context, tx store.Tx, nodeIDs []string) error {
	e := h.rn.Engine
	now := e.Clock.Now()
	var evs []envelope.Event
	if err := h.NodesStateChanged(ctx, tx, nodeIDs); err != nil {
		return err
	}
	for _, id := range nodeIDs {
		rs, err := onNode(ctx, tx, id, StatePlaced, StateBinding, StateActive)
		if err != nil {
			return err
		}
		for i := range rs {
			r := &rs[i]
			r.SetCondition(Condition{Type: CondNodeLost, Status: "true", Reason: "NodeLost",
				Message: "node " + r.Placement.NodeName + " stopped answering", UpdateTime: now})
			policy := pool.OnNodeLostRelease
			if p, err := pool.Get(ctx, tx, "", r.PoolID); err == nil {
				policy = poolPolicy(p).GetOnNodeLost()
			}
			// A guest dies with its host: placing its booking elsewhere
			// would hold capacity for nothing, so an instance's is released
			// whatever the pool's policy (the instance is marked lost).
			if policy == pool.OnNodeLostReplace && r.Binding != BindingInstance {
				more, err := e.requeue(ctx, tx, r, now)
				if err != nil {
					return err
				}
				evs = append(evs, more...)
				continue
			}
			more, err := e.end(ctx, tx, r, StateReleased, "NodeLost", now)
			if err != nil {
				return err
			}
			evs = append(evs, more...)
		}
	}
	return h.rn.record(ctx, tx, evs)
}

// requeue gives a holding reservation's atoms back and puts it back in the
// queue to be placed elsewhere.
func (e *Engine) requeue(ctx context.Context, tx store.Tx, r *Reservation, now time.Time) ([]envelope.Event, error) {
	from := r.State
	nodeID, id, poolID, start := r.NodeID, r.ID, r.PoolID, r.StartsAt
	tx.AfterCommit(func() {
		if ix := e.Cached(poolID); ix != nil {
			ix.Released(nodeID, id, start, e.Clock.Now())
		}
	})
	// The bookings go: the reservation is booked afresh where it lands.
	if _, err := booking.Delete(ctx, tx, []string{r.ID}); err != nil {
		return nil, err
	}
	if err := rollupBooked(ctx, tx, r, -1); err != nil {
		return nil, err
	}
	r.SetCondition(Condition{Type: CondDevicesHeld, Status: "false", Reason: "NodeLost", Message: "the bookings were given back to place it again", UpdateTime: now})
	// A new placement starts its binds afresh: the attempts the lost node
	// used up are not held against the next one.
	r.State, r.NodeID, r.GPUModel, r.CommandID, r.BindDeadline, r.BindAttempts = StatePending, "", "", "", nil, 0
	r.Placement = PlacementRecord{NUMA: -1, Island: -1}
	if from == StateActive {
		t := now
		r.ActiveUntil = &t
	}
	r.UpdateTime = now
	if err := saveMoved(ctx, tx, r, from, now); err != nil {
		return nil, err
	}
	return []envelope.Event{event("reservation.requeued", r, map[string]any{"reason": "NodeLost"})}, e.wake(ctx, tx, r.PoolID)
}

func sortByCreate(rs []Reservation) {
	slices.SortStableFunc(rs, func(a, b Reservation) int {
		return cmp.Or(a.CreateTime.Compare(b.CreateTime), cmp.Compare(a.ID, b.ID))
	})
}
