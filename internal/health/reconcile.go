package health

import (
	"context"
	"errors"
	"fmt"
	"time"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/gpuhealth"
	"github.com/better-compute/better-compute/internal/profiles"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// Policy defaults (policy.health).
const (
	DefaultBudgetPercent  = 5
	DefaultBreakerPercent = 10
	DefaultBreakerWindow  = 10 * time.Minute
)

// Budget is the most nodes of a pool of nodes under remediation at once:
// the policy's percentage, rounded down, and at least one.
func Budget(nodes int, p *apiv1.HealthPolicy) int {
	pct := int(p.GetDisruptionBudgetPercent())
	if pct == 0 {
		pct = DefaultBudgetPercent
	}
	return max(1, nodes*pct/100)
}

// BreakerLimit is how many of a pool's nodes may turn unhealthy within the
// window before the breaker trips (it trips at more): the policy's
// percentage, rounded down, and at least one — one bad node is never a
// fleet-wide cause.
func BreakerLimit(nodes int, p *apiv1.HealthPolicy) int {
	pct := int(p.GetBreakerPercent())
	if pct == 0 {
		pct = DefaultBreakerPercent
	}
	return max(1, nodes*pct/100)
}

// BreakerWindow is the policy's breaker window.
func BreakerWindow(p *apiv1.HealthPolicy) time.Duration {
	if w := p.GetBreakerWindowSeconds(); w > 0 {
		return time.Duration(w) * time.Second
	}
	return DefaultBreakerWindow
}

// PoolStatus is a pool's health at a glance.
type PoolStatus struct {
	PoolID, TenantID, Name string
	Policy                 *apiv1.PoolPolicy
	Nodes, Unhealthy       int
	Budget, BudgetUsed     int
	GPUsTotal, GPUsOut     int
	Pending                int
	Breaker                Breaker
}

// PoolStatusOf reads a pool's health, with its GPUs counted.
func PoolStatusOf(ctx context.Context, q store.Querier, poolID string, now time.Time) (PoolStatus, error) {
	st, err := poolStatus(ctx, q, poolID, now)
	if err != nil {
		return st, err
	}
	if st.GPUsTotal, err = atoms.GPUCountOfPool(ctx, q, poolID); err != nil {
		return st, err
	}
	st.GPUsOut, err = GPUsOutOfPool(ctx, q, poolID)
	return st, err
}

// poolStatus reads what the reconciler needs of a pool: its nodes, its
// unhealthy ones within the breaker's window, its budget and breaker.
func poolStatus(ctx context.Context, q store.Querier, poolID string, now time.Time) (PoolStatus, error) {
	st := PoolStatus{PoolID: poolID}
	p, err := pool.Get(ctx, q, "", poolID)
	if err != nil {
		return st, err
	}
	st.TenantID, st.Name, st.Policy = p.TenantID, p.Name, &apiv1.PoolPolicy{}
	if err := unmarshalPolicy(p.Policy, st.Policy); err != nil {
		return st, fmt.Errorf("pool %s: policy: %w", poolID, err)
	}
	hp := st.Policy.GetHealth()
	if st.Nodes, err = pool.NodeCount(ctx, q, poolID); err != nil {
		return st, err
	}
	if st.Unhealthy, err = UnhealthyNodes(ctx, q, poolID, now.Add(-BreakerWindow(hp))); err != nil {
		return st, err
	}
	if st.BudgetUsed, st.Pending, err = RemediationLoad(ctx, q, poolID); err != nil {
		return st, err
	}
	st.Budget = Budget(st.Nodes, hp)
	st.Breaker, err = BreakerGet(ctx, q, poolID)
	return st, err
}

// Reconcile moves every pool's remediations on: it trips breakers, starts
// pending remediations within each pool's budget (draining their nodes),
// and starts the workflow of each whose node has drained. It is
// level-triggered and safe to run twice; it returns how many remediations
// it moved.
func (m *Module) Reconcile(ctx context.Context) (int, error) {
	now := m.clock.Now()
	var pools []string
	if err := m.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		pools, err = PoolsWithWork(ctx, tx, now.Add(-24*time.Hour))
		return err
	}); err != nil {
		return 0, err
	}
	moved := 0
	var errs []error
	for _, p := range pools {
		n, err := m.reconcilePool(ctx, p)
		moved += n
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %q: %w", p, err))
		}
	}
	return moved, errors.Join(errs...)
}

// reconcilePool runs one pass over one pool (pool "" holds the nodes of no
// pool: budget one, no breaker).
func (m *Module) reconcilePool(ctx context.Context, poolID string) (int, error) {
	moved := 0
	err := m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		moved = 0
		now := m.clock.Now()
		st := PoolStatus{PoolID: poolID, Policy: &apiv1.PoolPolicy{}, Breaker: Breaker{PoolID: poolID, State: BreakerClosed}, Budget: 1}
		if poolID != "" {
			var err error
			st, err = poolStatus(ctx, tx, poolID, now)
			if errors.Is(err, store.ErrNotFound) {
				st = PoolStatus{PoolID: poolID, Policy: &apiv1.PoolPolicy{}, Breaker: Breaker{PoolID: poolID, State: BreakerClosed}, Budget: 1}
			} else if err != nil {
				return err
			}
			if st.Breaker.State == BreakerClosed && st.TenantID != "" && st.Unhealthy > BreakerLimit(st.Nodes, st.Policy.GetHealth()) {
				if err := m.trip(ctx, tx, &st, now); err != nil {
					return err
				}
			}
		}
		rems, err := RemediationList(ctx, tx, RemediationsQuery{PoolID: poolID, States: activeRemStates})
		if err != nil {
			return err
		}
		used := 0
		for _, r := range rems {
			if r.State != RemPending {
				used++
			}
		}
		for i := range rems {
			r := &rems[i]
			switch r.State {
			case RemPending:
				if st.Breaker.State == BreakerOpen || used >= st.Budget {
					continue
				}
				ok, err := m.startDrain(ctx, tx, r, now)
				if err != nil {
					return err
				}
				if ok {
					used++
					moved++
				}
			case RemDraining:
				if st.Breaker.State == BreakerOpen {
					continue
				}
				ok, err := m.startWorkflow(ctx, tx, r, now)
				if err != nil {
					return err
				}
				if ok {
					moved++
				}
			}
		}
		return nil
	})
	return moved, err
}

// trip opens a pool's breaker.
func (m *Module) trip(ctx context.Context, tx store.Tx, st *PoolStatus, now time.Time) error {
	b := st.Breaker
	b.TenantID, b.State, b.TripTime, b.ResetTime, b.ResetBy = st.TenantID, BreakerOpen, &now, nil, ""
	b.Reason = fmt.Sprintf("%d of the pool's %d nodes turned unhealthy within %s (the limit is %d): a fleet-wide cause is likely; remediation stopped until an operator resets the breaker",
		st.Unhealthy, st.Nodes, BreakerWindow(st.Policy.GetHealth()), BreakerLimit(st.Nodes, st.Policy.GetHealth()))
	b.Trips++
	b.UpdateTime = now
	if err := BreakerPut(ctx, tx, &b); err != nil {
		return err
	}
	st.Breaker = b
	m.log.Warn("health breaker tripped", "pool", st.Name, "pool_id", st.PoolID, "unhealthy", st.Unhealthy, "nodes", st.Nodes)
	tx.AfterCommit(m.metrics.tripped)
	return m.events(ctx, tx, envelope.Event{Type: "health.breaker_tripped", TenantID: st.TenantID, ResourceType: "Pool", ResourceID: st.PoolID, Time: now,
		Data: map[string]any{"pool": st.Name, "unhealthy_nodes": st.Unhealthy, "nodes": st.Nodes, "reason": b.Reason}})
}

// ResetBreaker closes a pool's breaker (an operator's command; the caller
// authorizes and audits).
func (m *Module) ResetBreaker(ctx context.Context, tx store.Tx, poolID, tenantID, by, reason string) (Breaker, error) {
	now := m.clock.Now()
	b, err := BreakerGet(ctx, tx, poolID)
	if err != nil {
		return b, err
	}
	wasOpen := b.State == BreakerOpen
	b.TenantID, b.State, b.ResetTime, b.ResetBy, b.UpdateTime = tenantID, BreakerClosed, &now, by, now
	if wasOpen {
		b.Reason = "reset: " + reason
	}
	if err := BreakerPut(ctx, tx, &b); err != nil {
		return b, err
	}
	if err := m.wake(ctx, tx); err != nil {
		return b, err
	}
	return b, m.events(ctx, tx, envelope.Event{Type: "health.breaker_reset", TenantID: tenantID, ResourceType: "Pool", ResourceID: poolID, Time: now,
		Data: map[string]any{"by": by, "reason": reason, "was_open": wasOpen}})
}

// startDrain moves a pending remediation to draining: its node stops
// taking work. A node gone or retired cancels it.
func (m *Module) startDrain(ctx context.Context, tx store.Tx, r *Remediation, now time.Time) (bool, error) {
	n, err := fleet.NodeGet(ctx, tx, "", r.NodeID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && n.State == fleet.NodeRetired) {
		return m.endRemediation(ctx, tx, r, RemPending, RemCanceled, "the node is gone", now)
	}
	if err != nil {
		return false, err
	}
	from := r.State
	drained, err := fleet.SystemDrain(ctx, tx, m.cfg.Fleet, m.cfg.Recorder, n.ID, "health: "+r.Reason, "system:health", now)
	if err != nil {
		return false, err
	}
	if r.Action == gpuhealth.ActionReboot && m.cfg.Capacity != nil {
		// A reboot takes the whole node: what can move goes elsewhere now
		// rather than hold the drain until it ends.
		_, move, err := m.poolPolicyOf(ctx, tx, r.NodeID)
		if err != nil {
			return false, err
		}
		gpus, err := NodeGPUs(ctx, tx, r.NodeID)
		if err != nil {
			return false, err
		}
		for _, g := range gpus {
			if _, _, err := m.cfg.Capacity.GPUUnhealthy(ctx, tx, r.NodeID, g.UUID, "the node drains for a reboot ("+r.Reason+")", move); err != nil {
				return false, err
			}
		}
	}
	r.State, r.Drained, r.StartTime, r.UpdateTime = RemDraining, drained, &now, now
	ok, err := RemediationUpdate(ctx, tx, r, from)
	if err != nil || !ok {
		return false, err
	}
	return true, m.events(ctx, tx, remEvent("health.remediation_draining", r, n.Name, now))
}

// Drained reports whether a remediation's node (or, for a GPU reset, the
// GPU) holds no work any more: the node stopped taking work and no booking
// in effect is left on it (or on the GPU).
func Drained(ctx context.Context, q store.Querier, nodeID, gpuUUID string, now time.Time) (bool, error) {
	n, err := fleet.NodeGet(ctx, q, "", nodeID)
	if err != nil {
		return false, err
	}
	// Drained, or draining with no agent left to acknowledge it.
	stopped := n.State == fleet.NodeDrained || (n.State == fleet.NodeDraining && n.Liveness != fleet.LivenessReady)
	if !stopped {
		return false, nil
	}
	held, err := atoms.BookedNow(ctx, q, nodeID, gpuUUID, now)
	return held == 0, err
}

// Remediation workflow profiles and the step kinds they run on the node.
const (
	ProfileGPUReset = "remediate-gpu-reset"
	ProfileReboot   = "remediate-reboot"
	KindGPUReset    = "gpu.reset"
	KindNodeReboot  = "node.reboot"
)

// Profiles are the remediation workflows, run on the provisioning engine
// with the node as their target; they ship as documents
// (internal/profiles/builtin).
func Profiles() []provision.Profile { return profiles.MustProfiles(ProfileGPUReset, ProfileReboot) }

// startWorkflow starts a draining remediation's workflow once its node has
// drained.
func (m *Module) startWorkflow(ctx context.Context, tx store.Tx, r *Remediation, now time.Time) (bool, error) {
	if m.engine == nil {
		return false, nil
	}
	gpu := ""
	if r.Action == gpuhealth.ActionReset {
		gpu = r.GPUUUID
	}
	ok, err := Drained(ctx, tx, r.NodeID, gpu, now)
	if errors.Is(err, store.ErrNotFound) {
		return m.endRemediation(ctx, tx, r, RemDraining, RemCanceled, "the node is gone", now)
	}
	if err != nil || !ok {
		return false, err
	}
	profile := ProfileReboot
	if r.Action == gpuhealth.ActionReset {
		profile = ProfileGPUReset
	}
	w, err := m.engine.StartTx(ctx, tx, provision.StartParams{TenantID: r.TenantID, TargetID: r.NodeID, Profile: profile,
		Input: map[string]any{"gpu": r.GPUUUID, "remediation_id": r.ID, "node_id": r.NodeID}, CreatedBy: "system:health"})
	if errors.Is(err, provision.ErrTargetBusy) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	r.State, r.WorkflowID, r.UpdateTime = RemRunning, w.ID, now
	ok, err = RemediationUpdate(ctx, tx, r, RemDraining)
	if err != nil || !ok {
		return false, errors.Join(err, errMovedUnder(ok))
	}
	n, _ := fleet.NodeGet(ctx, tx, "", r.NodeID)
	return true, m.events(ctx, tx, remEvent("health.remediation_running", r, n.Name, now))
}

func errMovedUnder(ok bool) error {
	if ok {
		return nil
	}
	return errors.New("health: the remediation moved under the reconciler")
}

// WorkflowEnded ends the remediation a workflow ran, in the transaction
// that ends the workflow: a success lifts what the remediation's findings
// quarantined (not RMA), resolves them and undrains the node the
// reconciler drained; a failure or cancellation escalates the node to
// maintenance. Workflows of other targets are none of its business.
func (m *Module) WorkflowEnded(ctx context.Context, tx store.Tx, w provision.Workflow) error {
	rs, err := RemediationList(ctx, tx, RemediationsQuery{WorkflowID: w.ID, States: []string{RemRunning}, Limit: 1})
	if err != nil || len(rs) == 0 {
		return err
	}
	r := &rs[0]
	now := m.clock.Now()
	n, err := fleet.NodeGet(ctx, tx, "", r.NodeID)
	if err != nil {
		return err
	}
	if w.State != provision.WorkflowSucceeded {
		why := fmt.Sprintf("%s of %s %s: %s", w.Profile, n.Name, w.State, w.Reason)
		if _, err := m.endRemediation(ctx, tx, r, RemRunning, RemEscalated, why, now); err != nil {
			return err
		}
		return m.escalateNode(ctx, tx, n, r.ID, r.FindingID, why, now)
	}
	// The findings this remediation answers: linked to it, or on its GPU
	// (a reset) or its node (a reboot) and open when it started.
	open, err := FindingList(ctx, tx, FindingsQuery{NodeID: r.NodeID, State: FindingOpen})
	if err != nil {
		return err
	}
	var ids []string
	lift := map[string]bool{}
	for _, f := range open {
		if f.Standing && f.RemediationID != r.ID {
			continue // a standing finding clears when bcd stops reporting it
		}
		if r.Action == gpuhealth.ActionReset && f.GPUUUID != r.GPUUUID && f.RemediationID != r.ID {
			continue
		}
		if f.Action == gpuhealth.ActionRMA {
			continue
		}
		ids = append(ids, f.ID)
		if f.GPUUUID != "" {
			lift[f.GPUUUID] = true
		}
	}
	if _, err := FindingsResolve(ctx, tx, ids, "remediation:"+r.ID, now); err != nil {
		return err
	}
	for uuid := range lift {
		g, err := GPUGet(ctx, tx, uuid)
		if errors.Is(err, store.ErrNotFound) || (err == nil && g.State == GPURMA) {
			continue
		}
		if err != nil {
			return err
		}
		if _, err := m.lift(ctx, tx, n, uuid, "remediation:"+r.ID, r.Action+" succeeded", now); err != nil {
			return err
		}
	}
	if _, err := m.endRemediation(ctx, tx, r, RemRunning, RemSucceeded, "", now); err != nil {
		return err
	}
	if r.Drained {
		if _, err := fleet.SystemUndrain(ctx, tx, m.cfg.Fleet, m.cfg.Recorder, r.NodeID, "system:health", now); err != nil {
			return err
		}
	}
	return nil
}

// endRemediation moves a remediation from from to a final state.
func (m *Module) endRemediation(ctx context.Context, tx store.Tx, r *Remediation, from, to, why string, now time.Time) (bool, error) {
	r.State, r.Error, r.EndTime, r.UpdateTime = to, clip(why, 1024), &now, now
	ok, err := RemediationUpdate(ctx, tx, r, from)
	if err != nil || !ok {
		return false, err
	}
	if err := m.wake(ctx, tx); err != nil {
		return false, err
	}
	action := r.Action
	tx.AfterCommit(func() { m.metrics.remediationEnded(action, to) })
	name := ""
	if n, err := fleet.NodeGet(ctx, tx, "", r.NodeID); err == nil {
		name = n.Name
	}
	return true, m.events(ctx, tx, remEvent("health.remediation_"+to, r, name, now))
}

// poolPolicyOf reads the node's pool and whether its policy lets
// reservations move off bad GPUs.
func (m *Module) poolPolicyOf(ctx context.Context, q store.Querier, nodeID string) (string, bool, error) {
	poolID, pol, err := poolOfNode(ctx, q, nodeID)
	if err != nil {
		return "", false, err
	}
	return poolID, !pol.GetHealth().GetKeepReservations(), nil
}
