package reservation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"

	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

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

// PoolLiveReservations counts the pool's live reservations in the caller's
// transaction and names the first (pool.LiveReservations): an archive with
// if_idle refuses a pool that has any.
func (h Hooks) PoolLiveReservations(ctx context.Context, tx store.Tx, poolID string) (int, string, error) {
	return countLive(ctx, tx, poolID)
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
	now := h.rn.Engine.placers.Clock.Now()
	evs := h.rn.Engine.activate(&r, now)
	held := "limits applied at " + b.GetCgroup()
	if r.Binding == BindingKubernetes {
		held = "offered to the node's kubelet"
	}
	r.SetCondition(Condition{Type: CondDevicesHeld, Status: "true", Reason: "Bound", Message: held, UpdateTime: now})
	r.SetCondition(Condition{Type: CondBindTimeout, Status: "false", Reason: "Bound", Message: "the node confirmed the bind", UpdateTime: now})
	r.SetCondition(isolated(b.GetEnforced(), now))
	if err := saveMoved(ctx, tx, &r, StateBinding, now); err != nil {
		return err
	}
	return h.rn.record(ctx, tx, evs)
}

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
// killed what was left in the reservation's cgroup and removed it, or (a
// kubernetes binding) no pod holds its GPUs any more. A releasing
// reservation's bookings end then. Only the reservation's own node is
// heard: another node's report (signed by that node) changes nothing.
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
	now := h.rn.Engine.placers.Clock.Now()
	msg := fmt.Sprintf("the node killed %d leftover processes and removed the cgroup", rel.GetKilledProcesses())
	if r.Binding == BindingKubernetes {
		msg = "the node reported that no pod holds the reservation's GPUs"
	}
	changed := r.SetCondition(Condition{Type: CondNodeReleased, Status: "true", Reason: "Released", Message: msg, UpdateTime: now})
	if r.State == StateReleasing {
		evs, err := h.rn.Engine.finishHeld(ctx, tx, &r, ReasonPodsLetGo, "the node's pods let go of the GPUs: the bookings ended", now, now)
		if err != nil {
			return err
		}
		return h.rn.record(ctx, tx, evs)
	}
	if !changed {
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
		h.rn.Engine.placers.NodeChanged(tx, poolID, id, v)
	}
	return nil
}

// NodesLost marks the reservations of lost nodes NodeLost and, per their
// pool's policy, releases them or puts them back in the queue.
func (h Hooks) NodesLost(ctx context.Context, tx store.Tx, nodeIDs []string) error {
	e := h.rn.Engine
	now := e.placers.Clock.Now()
	var evs []envelope.Event
	if err := h.NodesStateChanged(ctx, tx, nodeIDs); err != nil {
		return err
	}
	for _, id := range nodeIDs {
		rs, err := onNode(ctx, tx, id, StatePlaced, StateBinding, StateActive, StateReleasing)
		if err != nil {
			return err
		}
		for i := range rs {
			r := &rs[i]
			if r.Binding == BindingMachine && r.State != StatePlaced {
				// The lease took the machine from its node on purpose: the
				// lessee's OS runs no bcd. The lease, not the node, says
				// how it goes.
				continue
			}
			r.SetCondition(Condition{Type: CondNodeLost, Status: "true", Reason: "NodeLost",
				Message: "node " + r.Placement.NodeName + " stopped answering", UpdateTime: now})
			if r.State == StateReleasing {
				// Released already: it ends, whatever the pool's policy;
				// the lost node's pods hold nothing the fleet can book.
				more, err := e.finishHeld(ctx, tx, r, "NodeLost", "the node was lost: the bookings ended", now, now)
				if err != nil {
					return err
				}
				evs = append(evs, more...)
				continue
			}
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
		if ix := e.placers.Cached(poolID); ix != nil {
			ix.Released(nodeID, id, start, e.placers.Clock.Now())
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

// GPUUnhealthy tells the reservations holding a GPU that it went bad (an
// XID, a finding, an operator's quarantine): each gets the GpuUnhealthy
// condition and a reservation.gpu_unhealthy event. Where move is set, the
// pool replaces what it loses (on_node_lost replace) and the reservation's
// binding can move (node or none: not an instance, whose guest lives on the
// host, nor Kubernetes, whose pods do), the node is told to release it and
// it goes back in the queue to be placed elsewhere, in this transaction. It
// returns how many reservations held the GPU and how many moved.
func (h Hooks) GPUUnhealthy(ctx context.Context, tx store.Tx, nodeID, gpuUUID, reason string, move bool) (held, moved int, err error) {
	e := h.rn.Engine
	now := e.placers.Clock.Now()
	ids, err := holdingGPU(ctx, tx, nodeID, gpuUUID, now)
	if err != nil {
		return 0, 0, err
	}
	var evs []envelope.Event
	for _, id := range ids {
		r, err := getForUpdate(ctx, tx, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return held, moved, err
		}
		if !capmodel.Holding(r.State) || r.NodeID != nodeID {
			continue
		}
		held++
		r.SetCondition(Condition{Type: CondGPUUnhealthy, Status: "true", Reason: "GpuUnhealthy",
			Message: "GPU " + gpuUUID + " was taken out of service: " + reason, UpdateTime: now})
		evs = append(evs, event("reservation.gpu_unhealthy", &r, map[string]any{"gpu": gpuUUID, "reason": reason}))
		policy := pool.OnNodeLostRelease
		if p, err := pool.Get(ctx, tx, "", r.PoolID); err == nil {
			policy = poolPolicy(p).GetOnNodeLost()
		}
		if move && policy == pool.OnNodeLostReplace && (r.Binding == BindingNode || r.Binding == BindingNone) && r.State != StateReleasing {
			if r.Binding == BindingNode && (r.State == StateBinding || r.State == StateActive) {
				if _, err := e.Commands.Send(ctx, tx, Command{
					TenantID: r.TenantID, NodeID: r.NodeID, Kind: KindAllocationRelease, Params: map[string]any{"allocation_id": r.ID},
					IdempotencyKey: r.ID + "/release/" + r.Placement.NodeName, CreatedBy: "system:health", TTL: e.bindTimeout(), Time: now,
				}); err != nil {
					return held, moved, fmt.Errorf("send allocation.release: %w", err)
				}
				if e.Exec != nil {
					if err := e.Exec.EndAllocation(ctx, tx, r.NodeID, r.ID); err != nil {
						return held, moved, fmt.Errorf("end the reservation's processes: %w", err)
					}
				}
			}
			more, err := e.requeue(ctx, tx, &r, now)
			if err != nil {
				return held, moved, err
			}
			evs = append(evs, more...)
			moved++
			continue
		}
		if err := saveMoved(ctx, tx, &r, r.State, now); err != nil {
			return held, moved, err
		}
	}
	return held, moved, h.rn.record(ctx, tx, evs)
}

// MachineLeaseDeploying notes that the lessee accepted a binding machine
// reservation's lease: the accept window's deadline goes (a deploy ends on
// its own, in MachineLeaseActive or MachineLeaseFailed).
func (h Hooks) MachineLeaseDeploying(ctx context.Context, tx store.Tx, reservationID, leaseID string) error {
	r, ok, err := h.machineBinding(ctx, tx, reservationID)
	if err != nil || !ok || r.State != StateBinding {
		return err
	}
	now := h.rn.Engine.placers.Clock.Now()
	r.BindDeadline = nil
	r.SetCondition(Condition{Type: CondMachineLease, Status: "false", Reason: "Deploying",
		Message: "lease " + leaseID + " deploys your image", UpdateTime: now})
	if err := saveMoved(ctx, tx, &r, StateBinding, now); err != nil {
		return err
	}
	return h.rn.record(ctx, tx, []envelope.Event{event("reservation.binding", &r, map[string]any{"lease_id": leaseID, "lease_state": "deploying"})})
}

// MachineLeaseActive binds a binding machine reservation: its lease's
// deploy succeeded, and the machine runs the lessee's image.
func (h Hooks) MachineLeaseActive(ctx context.Context, tx store.Tx, reservationID, leaseID string) error {
	r, ok, err := h.machineBinding(ctx, tx, reservationID)
	if err != nil || !ok || r.State != StateBinding {
		return err
	}
	now := h.rn.Engine.placers.Clock.Now()
	evs := h.rn.Engine.activate(&r, now)
	r.SetCondition(Condition{Type: CondMachineLease, Status: "true", Reason: "Active",
		Message: "lease " + leaseID + " is active: the machine runs your image, root is yours", UpdateTime: now})
	if err := saveMoved(ctx, tx, &r, StateBinding, now); err != nil {
		return err
	}
	return h.rn.record(ctx, tx, evs)
}

// MachineLeaseFailed fails a binding machine reservation whose lease's
// deploy failed. The lease stays, failed, for its release to tear down
// what the lessee's image left.
func (h Hooks) MachineLeaseFailed(ctx context.Context, tx store.Tx, reservationID, leaseID, reason string) error {
	r, ok, err := h.machineBinding(ctx, tx, reservationID)
	if err != nil || !ok || !capmodel.Live(r.State) {
		return err
	}
	now := h.rn.Engine.placers.Clock.Now()
	r.SetCondition(Condition{Type: CondMachineLease, Status: "false", Reason: "Failed",
		Message: truncateCond("lease " + leaseID + ": " + reason + " (machines lease-release " + leaseID + " tears it down)"), UpdateTime: now})
	evs, err := h.rn.Engine.end(ctx, tx, &r, StateFailed, "LeaseFailed", now)
	if err != nil {
		return err
	}
	return h.rn.record(ctx, tx, evs)
}

// machineBinding reads a binding machine reservation under its lock.
func (h Hooks) machineBinding(ctx context.Context, tx store.Tx, id string) (Reservation, bool, error) {
	r, err := getForUpdate(ctx, tx, id)
	if errors.Is(err, store.ErrNotFound) {
		return r, false, nil
	}
	return r, err == nil && r.Binding == BindingMachine, err
}

// ReservationLive reports whether a reservation is still live (pending to
// releasing); a missing one is not.
func (h Hooks) ReservationLive(ctx context.Context, tx store.Tx, id string) (bool, error) {
	r, err := Get(ctx, tx, "", id)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil && capmodel.Live(r.State), err
}
