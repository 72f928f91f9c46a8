package reservation

import (
	"context"
	"errors"
	"fmt"
	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/riverqueue/river"
	"google.golang.org/protobuf/encoding/protojson"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/gpumodel"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// CommandSender persists a command for a node in the caller's transaction
// and wakes the node's session once it commits: the fleet's command path.
type CommandSender interface {
	Send(ctx context.Context, tx store.Tx, c Command) (commandID string, err error)
}

// Command is one command for a node.
type Command struct {
	TenantID, NodeID, Kind string
	Params                 map[string]any
	IdempotencyKey         string
	CreatedBy              string
	TTL                    time.Duration
	Time                   time.Time
}

// Command kinds the engine sends (the agent's names).
const (
	KindAllocationBind    = "allocation.bind"
	KindAllocationRelease = "allocation.release"
)

// MaxReplans is how many times one placement is retried after losing a race
// for its atoms before the reservation waits in the queue.
const MaxReplans = 3

// Engine carries a reservation through its life. Every method runs in the
// caller's transaction and returns the events to record with it.
type Engine struct {
	// DB is read to refresh pool indexes in the background.
	DB       *store.DB
	Clock    clock.Clock
	Commands CommandSender
	// Enqueue inserts a job in the caller's transaction.
	Enqueue func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error
	// BindTimeout bounds an allocation.bind; default 60s. BindAttempts is
	// how many are sent before the reservation fails; default 3.
	BindTimeout  time.Duration
	BindAttempts int
	Reconciler   atoms.Reconciler

	// IndexRefresh is how often a pool's in-memory index is reloaded;
	// default DefaultIndexRefresh.
	IndexRefresh time.Duration

	// BatchObserved observes each placer transaction: how many mutations
	// it carried and how long it held the writer, from BEGIN to COMMIT
	// (benchmarks read it); nil skips it.
	BatchObserved func(size int, hold time.Duration)
	// Env stages placer batches' audit rows, events and idempotency
	// records; NewService sets it.
	Env *envelope.Envelope

	// PendingEvery, when set (several replicas on PostgreSQL), is how often
	// a pool's placer runs PendingPass for its pool.
	PendingEvery time.Duration
	PendingPass  func(poolID string)

	plMu    sync.Mutex
	placers map[string]*placer
	cluster *cluster
	stopped bool

	replans    atomic.Int64
	seed       atomic.Uint64
	ixMu       sync.Mutex
	indexes    map[string]*poolIndex
	loading    map[string]*indexLoad
	refreshing map[string]bool
}

func (e *Engine) bindTimeout() time.Duration {
	if e.BindTimeout <= 0 {
		return time.Minute
	}
	return e.BindTimeout
}

func (e *Engine) bindAttempts() int {
	if e.BindAttempts <= 0 {
		return 3
	}
	return e.BindAttempts
}

// Replans counts placements retried after a lost race (for benchmarks).
func (e *Engine) Replans() int64 { return e.replans.Load() }

func event(typ string, r *Reservation, data map[string]any) envelope.Event {
	if data == nil {
		data = map[string]any{}
	}
	data["state"] = r.State
	if r.NodeID != "" {
		data["node_id"] = r.NodeID
	}
	return envelope.Event{Type: typ, TenantID: r.TenantID, ResourceType: "Reservation", ResourceID: r.ID, Data: data}
}

// savepoint runs fn under a savepoint: an error rolls back fn's writes only,
// leaving the transaction usable (PostgreSQL aborts a transaction on any
// error otherwise).
func savepoint(ctx context.Context, tx store.Tx, fn func() error) error {
	return savepointNamed(ctx, tx, "place", fn)
}

// errHostFull: the node's host memory is taken by a booking placement did not
// see; like an overlap, it means replan.
var errHostFull = errors.New("host resources taken concurrently")

// request is the placement request of a reservation.
func request(r *Reservation) placement.Request {
	return placement.Request{
		GPUs: r.GPUs, Model: r.Model, MIGProfile: r.MIGProfile, Slots: r.Slots, VCPU: r.VCPU, MemoryGiB: r.MemoryGiB,
		Hugepages1Gi: r.Hugepages1Gi, Tenant: r.TenantID, SingleTenant: r.SingleTenant,
		Tolerations: []string{"dedicated=" + r.TenantID},
	}
}

// place finds a plan and books it in the batch. It looks at the fullest
// candidate nodes first and scans the whole pool only when none fits. In a
// placer batch the index is the truth (the placer is the pool's only
// writer), so the first plan is booked; a plan the database refuses — which
// only the per-item fallback can see — is followed by the next plan, and
// after a round of such refusals the index re-reads the contested nodes and
// places again, up to MaxReplans times. It reports whether the reservation
// was placed and, when not, why.
func (e *Engine) place(ctx context.Context, b *batch, r *Reservation, now time.Time) (bool, placement.Explanation, error) {
	ix := b.ix
	req := request(r)
	need := r.GPUs + r.Slots
	var ex placement.Explanation
	for attempt := 0; attempt < MaxReplans; attempt++ {
		snap := ix.snapshot(r.StartsAt, r.EndsAt, need, candidateLimit, e.rng())
		res, err := placement.Place(snap.snap, req, placement.Options{Limit: 4})
		if err != nil {
			return false, ex, err
		}
		if len(res.Plans) == 0 {
			snap = ix.snapshot(r.StartsAt, r.EndsAt, 0, 0, nil)
			if res, err = placement.Place(snap.snap, req, placement.Options{Limit: 4}); err != nil {
				return false, ex, err
			}
		}
		ex = res.Explanation
		if len(res.Plans) == 0 {
			return false, ex, nil
		}
		var contested []string
		for k := range res.Plans {
			plan := &res.Plans[k]
			m := b.mark()
			err := e.book(ctx, b, r, plan, snap.nodes[plan.NodeID])
			if b.immediate && err != nil {
				b.rewind(m)
			}
			switch {
			case errors.Is(err, errNodeGone):
				ix.markUnschedulable(plan.NodeID)
				continue
			case errors.Is(err, errStaleIndex):
				// The pool changed under the index and no delta told it
				// yet: leave the node out now, reload after the batch.
				ix.markUnschedulable(plan.NodeID)
				b.stale = true
				continue
			case errors.Is(err, booking.ErrOverlap) || errors.Is(err, errHostFull):
				contested = append(contested, plan.NodeID)
				continue
			case err != nil:
				return false, ex, err
			}
			return true, ex, nil
		}
		if len(contested) == 0 {
			continue
		}
		e.replans.Add(1)
		if err := ix.sync(ctx, b.tx, contested, now); err != nil {
			return false, ex, err
		}
	}
	return false, ex, nil
}

func (e *Engine) rng() *rand.Rand {
	return rand.New(rand.NewPCG(e.seed.Add(1), 0x9e3779b97f4a7c15))
}

// errNodeGone: the chosen node is no longer active and ready.
var errNodeGone = errors.New("node left placement")

// errStaleIndex: the chosen atoms are no longer in the pool or usable.
var errStaleIndex = errors.New("pool index is stale")

// book books the plan for r in the batch and marks the index (undone if
// the batch, or in the fallback the item, rolls back).
func (e *Engine) book(ctx context.Context, b *batch, r *Reservation, plan *placement.Plan, n *placement.Node) error {
	bs := make([]booking.Booking, 0, len(plan.Atoms))
	for _, a := range plan.Atoms {
		bs = append(bs, booking.Booking{ReservationID: r.ID, Atom: a, StartsAt: r.StartsAt, EndsAt: r.EndsAt})
	}
	// CPUs are booked as ranges, one row per contiguous run.
	runs := booking.CPURanges(plan.CPUs)
	cpus := make([]booking.CPURange, len(runs))
	for i, run := range runs {
		cpus[i] = booking.CPURange{ReservationID: r.ID, NodeID: plan.NodeID, Lo: run[0], Hi: run[1], StartsAt: r.StartsAt, EndsAt: r.EndsAt}
	}
	// The node must still take bookings (FOR SHARE on PostgreSQL: a
	// liveness sweep marking it lost waits for this batch to commit, and
	// its NodesLost hook then sees the booking).
	if err := b.checkNode(ctx, plan.NodeID); err != nil {
		return err
	}
	if b.immediate {
		// The plan came from the index; the atoms must still be in the
		// pool and usable. A batch checks all its atoms at once instead.
		if ok, err := atomsUsable(ctx, b.tx, r.PoolID, plan.NodeID, plan.Atoms); err != nil || !ok {
			return errors.Join(err, errStaleIndex)
		}
	} else {
		b.atoms = append(b.atoms, plan.Atoms...)
	}
	if err := b.stageBookings(ctx, bs, cpus); err != nil {
		return err
	}
	if b.immediate && (r.MemoryGiB > 0 || r.Hugepages1Gi > 0) {
		// The database's word on host memory, in the fallback; a batch
		// trusts the index, whose placer is the node's only booker.
		if err := checkHost(ctx, b.tx, r, plan.NodeID); err != nil {
			return err
		}
	}
	if err := e.recordPlan(r, plan, n); err != nil {
		return err
	}
	if ix := b.ix; ix != nil {
		ix.mark(r, plan, b.now)
		nodeID, id, start := plan.NodeID, r.ID, r.StartsAt
		b.undo = append(b.undo, func() { ix.released(nodeID, id, start, b.now) })
	}
	return nil
}

// recordPlan records a plan's placement on r.
func (e *Engine) recordPlan(r *Reservation, plan *placement.Plan, n *placement.Node) error {
	rec := PlacementRecord{NodeName: plan.NodeName, Atoms: plan.Atoms, CPUs: plan.CPUs, CPUSet: plan.CPUSet, NUMA: plan.NUMA,
		Island: -1, Kinds: map[string]int{},
		Score: [5]float64{plan.Score.Binpack, plan.Score.Topology, plan.Score.Fragmentation, plan.Score.Spread, plan.Score.Total}}
	islands := map[int]bool{}
	model := ""
	for _, a := range plan.Atoms {
		uuid, kind := a, KindGPU
		if i := strings.Index(a, "/mig/"); i >= 0 {
			uuid, kind = a[:i], KindMIG
		} else if i := strings.LastIndex(a, "/s"); i >= 0 {
			uuid, kind = a[:i], KindSlot
		}
		rec.Kinds[kind]++
		if !slices.Contains(rec.GPUUUIDs, uuid) {
			rec.GPUUUIDs = append(rec.GPUUUIDs, uuid)
		}
		if n != nil {
			for _, g := range n.GPUs {
				if g.UUID == uuid {
					islands[g.Island] = true
					model = g.Model
				}
			}
		}
	}
	if len(islands) == 1 {
		for i := range islands {
			rec.Island = i
		}
	}
	rec.AtomModel = model
	r.NodeID, r.GPUModel, r.Placement = plan.NodeID, gpumodel.Short(model), rec
	return nil
}

// held moves a freshly placed reservation to placed, or further when its
// window has begun.
func (e *Engine) held(ctx context.Context, b *batch, r *Reservation, now time.Time) ([]envelope.Event, error) {
	r.State = StatePlaced
	r.Explanation = "{}"
	r.SetCondition(Condition{Type: CondDevicesHeld, Status: "true", Reason: "Booked",
		Message: fmt.Sprintf("%d atoms on %s", len(r.Placement.Atoms), r.Placement.NodeName), UpdateTime: now})
	for kind, n := range r.Placement.Kinds {
		if err := b.stageRollup(ctx, r.PoolID, r.Placement.AtomModel, kind, n); err != nil {
			return nil, err
		}
	}
	evs := []envelope.Event{event("reservation.placed", r, map[string]any{"atoms": r.Placement.Atoms})}
	more, err := e.startIfDue(ctx, b.tx, r, now)
	return append(evs, more...), err
}

// startIfDue starts a placed reservation whose window has begun: a node
// binding sends allocation.bind, the others are active at once (kubernetes:
// the kubelet binds from the booking).
func (e *Engine) startIfDue(ctx context.Context, tx store.Tx, r *Reservation, now time.Time) ([]envelope.Event, error) {
	if r.State != StatePlaced || r.StartsAt.After(now) {
		return nil, nil
	}
	if r.Binding != BindingNode {
		return e.activate(r, now), nil
	}
	return e.sendBind(ctx, tx, r, now)
}

func (e *Engine) activate(r *Reservation, now time.Time) []envelope.Event {
	r.State = StateActive
	t := now
	r.ActiveSince = &t
	r.BindDeadline = nil
	return []envelope.Event{event("reservation.active", r, nil)}
}

// sendBind sends (or resends) allocation.bind with the device assignment.
func (e *Engine) sendBind(ctx context.Context, tx store.Tx, r *Reservation, now time.Time) ([]envelope.Event, error) {
	r.BindAttempts++
	params := map[string]any{
		"allocation_id": r.ID,
		"gpu_uuids":     anySlice(r.Placement.GPUUUIDs),
		"cpuset_cpus":   r.Placement.CPUSet,
	}
	if r.VCPU > 0 {
		params["cpu_quota_us"] = float64(int64(r.VCPU) * 100000)
		params["cpu_period_us"] = float64(100000)
	}
	if r.MemoryGiB > 0 {
		params["memory_max_bytes"] = float64(int64(r.MemoryGiB) << 30)
	}
	if mems := r.CPUSetMems(); mems != "" {
		params["cpuset_mems"] = mems
	}
	id, err := e.Commands.Send(ctx, tx, Command{
		TenantID: r.TenantID, NodeID: r.NodeID, Kind: KindAllocationBind, Params: params,
		IdempotencyKey: bindKey(r), CreatedBy: "system:capacity", TTL: e.bindTimeout(), Time: now,
	})
	if err != nil {
		return nil, fmt.Errorf("send allocation.bind: %w", err)
	}
	r.State, r.CommandID = StateBinding, id
	deadline := now.Add(e.bindTimeout())
	r.BindDeadline = &deadline
	return []envelope.Event{event("reservation.binding", r, map[string]any{"command_id": id, "attempt": r.BindAttempts})}, nil
}

// bindKey is the idempotency key of a bind attempt. Attempts restart at
// one when a requeued reservation is placed again, so the key names the
// placement too: its node and start (a requeued window starts at the later
// time it is placed again).
func bindKey(r *Reservation) string {
	return fmt.Sprintf("%s/bind/%s/%d/%d", r.ID, r.NodeID, r.StartsAt.UnixMicro(), r.BindAttempts)
}

func anySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// end ends a live reservation in state (released, expired, failed or
// canceled) at now: its bookings end, the rollup gives the atoms back, a
// bound allocation is removed from the node, and the pool's queue is woken.
func (e *Engine) end(ctx context.Context, tx store.Tx, r *Reservation, state, reason string, now time.Time) ([]envelope.Event, error) {
	from := r.State
	if !capmodel.Live(from) {
		return nil, nil
	}
	// The end as stored: the bookings, the window and the index must agree
	// on it to the microsecond.
	at := now.UTC().Truncate(booking.Resolution)
	if capmodel.Holding(from) {
		var err error
		if at.After(r.StartsAt) {
			_, err = booking.Release(ctx, tx, []string{r.ID}, at)
		} else {
			// Not started: the atoms go back whole. Shrunk to its first
			// microsecond, a booking would still refuse them to every
			// window across that instant.
			err = bookingsDelete(ctx, tx, r.ID)
		}
		if err != nil {
			return nil, err
		}
		if err := rollupBooked(ctx, tx, r, -1); err != nil {
			return nil, err
		}
		r.SetCondition(Condition{Type: CondDevicesHeld, Status: "false", Reason: reason, Message: "the bookings ended", UpdateTime: now})
	}
	if (from == StateBinding || from == StateActive) && r.Binding == BindingNode && r.NodeID != "" && reason != "NodeLost" {
		if _, err := e.Commands.Send(ctx, tx, Command{
			TenantID: r.TenantID, NodeID: r.NodeID, Kind: KindAllocationRelease, Params: map[string]any{"allocation_id": r.ID},
			IdempotencyKey: r.ID + "/release", CreatedBy: "system:capacity", TTL: e.bindTimeout(), Time: now,
		}); err != nil {
			return nil, fmt.Errorf("send allocation.release: %w", err)
		}
	}
	if from == StateActive {
		t := now
		r.ActiveUntil = &t
	}
	switch {
	case at.Before(r.EndsAt) && at.After(r.StartsAt):
		r.EndsAt = at
	case !at.After(r.StartsAt):
		// Ended before it began: nothing was used, so nothing is charged
		// (the window keeps its first microsecond, as a window must).
		r.EndsAt = r.StartsAt.Add(booking.Resolution)
	}
	r.State = state
	r.BindDeadline = nil
	r.UpdateTime = now
	ok, err := save(ctx, tx, r, from)
	if err != nil || !ok {
		return nil, errors.Join(err, errMoved(ok))
	}
	evs := []envelope.Event{event("reservation."+state, r, map[string]any{"reason": reason})}
	if capmodel.Holding(from) {
		nodeID, id, pool := r.NodeID, r.ID, r.PoolID
		tx.AfterCommit(func() {
			if ix := e.cached(pool); ix != nil {
				ix.released(nodeID, id, at, e.Clock.Now())
			}
		})
		if err := e.wake(ctx, tx, r.PoolID); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

func errMoved(ok bool) error {
	if ok {
		return nil
	}
	return envelope.Errorf(envelope.CodeConflict, "the reservation changed concurrently; retry")
}

// wake asks the queued placer to look at a pool.
func (e *Engine) wake(ctx context.Context, tx store.Tx, poolID string) error {
	if e.Enqueue == nil || poolID == "" {
		return nil
	}
	// Not a unique job: transactions waking several pools would take the
	// unique index's locks in different orders and deadlock. A redundant
	// wake costs one placer pass that finds nothing (or little) to do.
	return e.Enqueue(ctx, tx, PlacePendingArgs{PoolID: poolID}, &river.InsertOpts{MaxAttempts: 3})
}

// WakePools wakes the queued placer for each pool (the reconciler's hook).
func (e *Engine) WakePools(ctx context.Context, tx store.Tx, poolIDs []string) error {
	for _, p := range poolIDs {
		if err := e.wake(ctx, tx, p); err != nil {
			return err
		}
	}
	return nil
}

// poolPolicy reads a pool's decoded policy.
func poolPolicy(p pool.Pool) *apiv1.PoolPolicy { return pool.Proto(p).GetPolicy() }

func explanationJSON(ex *apiv1.Explanation) string {
	b, err := protojson.Marshal(ex)
	if err != nil {
		return "{}"
	}
	return string(b)
}

// ExplanationProto converts a placement explanation for the API.
func ExplanationProto(ex placement.Explanation) *apiv1.Explanation {
	out := &apiv1.Explanation{Evaluated: int32(ex.Evaluated), Feasible: int32(ex.Feasible), Summary: ex.String()}
	for _, l := range ex.Lines() {
		out.Lines = append(out.Lines, &apiv1.ExplanationLine{Class: l.Class.String(), Reason: l.Reason, Nodes: int32(l.Nodes)})
	}
	return out
}

// charge is what r asks of its quotas.
func charge(r *Reservation) quota.Charge {
	model := r.GPUModel
	if model == "" {
		model = r.Model
	}
	return quota.Charge{TenantID: r.TenantID, ProjectID: r.ProjectID, PoolID: r.PoolID, Model: strings.ToUpper(model),
		GPUs: r.GPUs + r.Slots, Start: r.StartsAt, End: r.EndsAt, ExcludeReservationID: r.ID}
}

// decodeExplanation reads a stored explanation.
func decodeExplanation(s string) *apiv1.Explanation {
	ex := &apiv1.Explanation{}
	if s == "" || protojson.Unmarshal([]byte(s), ex) != nil {
		return nil
	}
	if ex.GetEvaluated() == 0 && len(ex.GetLines()) == 0 && ex.GetSummary() == "" {
		return nil
	}
	return ex
}
