package reservation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"google.golang.org/protobuf/encoding/protojson"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/quota"
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

// Engine carries a reservation through its life. Every method runs in the
// caller's transaction and returns the events to record with it.
type Engine struct {
	// Placers owns the pools' indexes and commits their batches; its DB
	// and Clock are the engine's too.
	placers placer.Placers

	Commands CommandSender
	// Enqueue inserts a job in the caller's transaction.
	Enqueue func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error
	// BindTimeout bounds an allocation.bind; default 60s. BindAttempts is
	// how many are sent before the reservation fails; default 3.
	BindTimeout  time.Duration
	BindAttempts int
	Reconciler   atoms.Reconciler
	// Exec is reservations.exec's path to the nodes; nil refuses it.
	Exec ExecPath
	// Machines binds binding machine reservations (the metal module's
	// leases); nil fails them when they start.
	Machines MachineLeases
}

// MachineLeases is the metal module's side of binding machine: a lease of
// the machine behind a node, offered to the reservation's tenant when the
// reservation starts, and its teardown when the reservation ends. Both run
// in the caller's transaction; a refusal is an *envelope.Error.
type MachineLeases interface {
	OfferForReservation(ctx context.Context, tx store.Tx, reservationID, tenantID, nodeID string, now time.Time) (leaseID string, err error)
	ReleaseForReservation(ctx context.Context, tx store.Tx, reservationID, reason string, now time.Time) error
}

// MachineAcceptWindow is how long a machine lease waits for its lessee's
// image and key before the reservation fails and the offer is withdrawn.
const MachineAcceptWindow = time.Hour

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

// held moves a freshly placed reservation to placed, or further when its
// window has begun.
func (e *Engine) held(ctx context.Context, b *placer.Batch, r *Reservation, now time.Time) ([]envelope.Event, error) {
	r.State = StatePlaced
	r.Explanation = "{}"
	r.SetCondition(Condition{Type: CondDevicesHeld, Status: "true", Reason: "Booked",
		Message: fmt.Sprintf("%d atoms on %s", len(r.Placement.Atoms), r.Placement.NodeName), UpdateTime: now})
	for kind, n := range r.Placement.Kinds {
		if err := b.StageRollup(ctx, r.PoolID, r.Placement.AtomModel, kind, n); err != nil {
			return nil, err
		}
	}
	evs := []envelope.Event{event("reservation.placed", r, map[string]any{"atoms": r.Placement.Atoms})}
	more, err := e.startIfDue(ctx, b.Tx(), r, now)
	return append(evs, more...), err
}

// startIfDue starts a placed reservation whose window has begun: a node or
// kubernetes binding sends allocation.bind (bcd applies the limits, or
// offers the GPUs to its kubelet) and goes active on the node's
// AllocationBound; the others are active at once.
func (e *Engine) startIfDue(ctx context.Context, tx store.Tx, r *Reservation, now time.Time) ([]envelope.Event, error) {
	if r.State != StatePlaced || r.StartsAt.After(now) {
		return nil, nil
	}
	if r.Binding == BindingMachine {
		return e.offerMachine(ctx, tx, r, now)
	}
	if !nodeBound(r) {
		return e.activate(r, now), nil
	}
	return e.sendBind(ctx, tx, r, now)
}

// offerMachine starts a binding machine reservation: the machine behind
// its node is offered to its tenant under a lease, which binds it once the
// lessee's deploy succeeded (MachineLeaseActive). A machine that cannot be
// leased is said in the MachineLease condition and fails the reservation at
// the next tick: this may run before the reservation's row is written (a
// placement's batch), where it cannot end yet.
func (e *Engine) offerMachine(ctx context.Context, tx store.Tx, r *Reservation, now time.Time) ([]envelope.Event, error) {
	var leaseID string
	err := error(&envelope.Error{Code: envelope.CodeFailedPrecondition, Message: "this control plane has no bare-metal module to lease machines"})
	if e.Machines != nil {
		leaseID, err = e.Machines.OfferForReservation(ctx, tx, r.ID, r.TenantID, r.NodeID, now)
	}
	if apiErr, ok := errors.AsType[*envelope.Error](err); ok {
		return notLeasable(r, apiErr.Message, now), nil
	}
	if err != nil {
		return nil, err
	}
	r.State = StateBinding
	deadline := now.Add(MachineAcceptWindow)
	r.BindDeadline = &deadline
	r.SetCondition(Condition{Type: CondMachineLease, Status: "false", Reason: "Offered",
		Message: fmt.Sprintf("lease %s waits for your image and root key: machines lease-accept %s --image IMAGE --ssh-key KEY (by %s)",
			leaseID, leaseID, deadline.Format(time.RFC3339)), UpdateTime: now})
	return []envelope.Event{event("reservation.binding", r, map[string]any{"lease_id": leaseID})}, nil
}

// notLeasable holds a binding machine reservation whose machine cannot be
// leased until the next tick fails it, saying why.
func notLeasable(r *Reservation, why string, now time.Time) []envelope.Event {
	r.State, r.BindDeadline = StateBinding, &now
	r.SetCondition(Condition{Type: CondMachineLease, Status: "false", Reason: "NotLeasable", Message: truncateCond(why), UpdateTime: now})
	return []envelope.Event{event("reservation.binding", r, map[string]any{"refused": why})}
}

// truncateCond bounds a condition message built from another module's
// error.
func truncateCond(s string) string {
	if len(s) > maxIsolatedMessage {
		return s[:maxIsolatedMessage]
	}
	return s
}

// nodeBound reports whether bcd on the reservation's node binds it (and
// must be told to release it).
func nodeBound(r *Reservation) bool {
	return r.Binding == BindingNode || r.Binding == BindingKubernetes
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
	if r.Binding == BindingKubernetes {
		// bcd offers the GPUs to its kubelet plugins instead of applying
		// cgroup limits (DeviceAssignment.binding); a node binding sends
		// none, as before, so an older bcd sees the params it knows.
		params["binding"] = BindingKubernetes
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
//
// A kubernetes binding the node confirmed (active: its kubelet may have
// handed the GPUs to pods) is not ended here but held: see hold. One still
// binding ends as a node one does (the node never confirmed it; holding it
// would keep the GPUs of a node that does not answer for good). A
// releasing one is left as it is (releasing twice is not an error);
// finishHeld ends it.
func (e *Engine) end(ctx context.Context, tx store.Tx, r *Reservation, state, reason string, now time.Time) ([]envelope.Event, error) {
	from := r.State
	if !capmodel.Live(from) || from == StateReleasing {
		return nil, nil
	}
	if from == StateActive && r.Binding == BindingKubernetes && r.NodeID != "" && reason != "NodeLost" {
		return e.hold(ctx, tx, r, state, reason, now)
	}
	// The end as stored: the bookings, the window and the index must agree
	// on it to the microsecond.
	at := now.UTC().Truncate(booking.Resolution)
	if capmodel.Holding(from) {
		if err := e.endBookings(ctx, tx, r, at); err != nil {
			return nil, err
		}
		r.SetCondition(Condition{Type: CondDevicesHeld, Status: "false", Reason: reason, Message: "the bookings ended", UpdateTime: now})
	}
	if (from == StateBinding || from == StateActive) && nodeBound(r) && r.NodeID != "" && reason != "NodeLost" {
		if _, err := e.Commands.Send(ctx, tx, Command{
			TenantID: r.TenantID, NodeID: r.NodeID, Kind: KindAllocationRelease, Params: map[string]any{"allocation_id": r.ID},
			IdempotencyKey: r.ID + "/release", CreatedBy: "system:capacity", TTL: e.bindTimeout(), Time: now,
		}); err != nil {
			return nil, fmt.Errorf("send allocation.release: %w", err)
		}
		r.SetCondition(Condition{Type: CondNodeReleased, Status: "false", Reason: "ReleaseSent",
			Message: "waiting for the node to kill the reservation's processes and remove its cgroup", UpdateTime: now})
		if e.Exec != nil {
			if err := e.Exec.EndAllocation(ctx, tx, r.NodeID, r.ID); err != nil {
				return nil, fmt.Errorf("end the reservation's processes: %w", err)
			}
		}
	}
	if (from == StateBinding || from == StateActive) && r.Binding == BindingMachine && e.Machines != nil && reason != "LeaseFailed" {
		// The machine goes back only through the lease's teardown (or, for
		// an offer never accepted, at once).
		if err := e.Machines.ReleaseForReservation(ctx, tx, r.ID, reason, now); err != nil {
			return nil, fmt.Errorf("release the machine lease: %w", err)
		}
		r.SetCondition(Condition{Type: CondMachineLease, Status: "false", Reason: "Released",
			Message: "the lease's teardown runs (fence, erase, diagnostics, firmware, BMC rotation)", UpdateTime: now})
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
		if err := e.bookingsEnded(ctx, tx, r, at); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

// endBookings ends a holding reservation's bookings at at and gives its
// atoms back to the rollup.
func (e *Engine) endBookings(ctx context.Context, tx store.Tx, r *Reservation, at time.Time) error {
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
		return err
	}
	return rollupBooked(ctx, tx, r, -1)
}

// bookingsEnded tells the pool's index once tx commits (freeing early would
// invite a placement the database then refuses) and wakes the pool's queue.
func (e *Engine) bookingsEnded(ctx context.Context, tx store.Tx, r *Reservation, at time.Time) error {
	nodeID, id, pool := r.NodeID, r.ID, r.PoolID
	tx.AfterCommit(func() {
		if ix := e.placers.Cached(pool); ix != nil {
			ix.Released(nodeID, id, at, e.placers.Clock.Now())
		}
	})
	return e.wake(ctx, tx, r.PoolID)
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

// poolPolicy reads a pool's decoded policy, decoded once per distinct
// policy text (pool.Policy). It is shared: never modify it.
func poolPolicy(p pool.Pool) *apiv1.PoolPolicy { return pool.Policy(p) }

func explanationJSON(ex *apiv1.Explanation) string {
	b, err := protojson.Marshal(ex)
	if err != nil {
		return "{}"
	}
	return string(b)
}

// charge is what r asks of its quotas and, priced, of its tenant's budget.
func charge(r *Reservation) quota.Charge {
	model := r.GPUModel
	if model == "" {
		model = r.Model
	}
	return quota.Charge{TenantID: r.TenantID, ProjectID: r.ProjectID, PoolID: r.PoolID, Model: strings.ToUpper(model),
		GPUs: r.GPUs + r.Slots, VCPU: r.VCPU, MemoryGiB: r.MemoryGiB, Flavor: r.Flavor,
		Start: r.StartsAt, End: r.EndsAt, ExcludeReservationID: r.ID}
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
