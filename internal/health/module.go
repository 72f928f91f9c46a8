package health

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"google.golang.org/protobuf/encoding/protojson"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/gpuhealth"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// ConditionGPUQuarantinedPrefix starts the node condition that takes one
// GPU out of placement (capacity's atoms read it): "GpuQuarantined/<uuid>".
const ConditionGPUQuarantinedPrefix = "GpuQuarantined/"

// ConditionMaintenance is the node condition of a node whose remediation
// escalated: it stays drained until an operator looks at it.
const ConditionMaintenance = "Maintenance"

// Capacity is what the module tells capacity, in the caller's transaction.
type Capacity interface {
	// NodeChanged: a GPU of the node left or rejoined placement.
	NodeChanged(ctx context.Context, tx store.Tx, nodeID string) error
	// GPUUnhealthy: the reservations holding the GPU are told, and moved
	// where move is set and they allow it.
	GPUUnhealthy(ctx context.Context, tx store.Tx, nodeID, gpuUUID, reason string, move bool) (held, moved int, err error)
}

// Config wires a Module.
type Config struct {
	DB       *store.DB
	Recorder envelope.Recorder
	Clock    clock.Clock
	Logger   *slog.Logger
	// Capacity may be set after New (SetCapacity), before work starts.
	Capacity Capacity
	// Fleet drains and undrains nodes (its Signer and Notifier are used).
	Fleet fleet.Deps
	// Enqueue inserts a River job in the caller's transaction
	// (jobs.Runtime.InsertTx): a change that gives the reconciler work
	// wakes it without waiting for its period. It may be set after New.
	Enqueue func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error
	// Interval is the reconciler's period; default 15 s.
	Interval time.Duration
}

// Module is the health module: findings, quarantine, remediation.
type Module struct {
	cfg     Config
	clock   clock.Clock
	log     *slog.Logger
	engine  *provision.Engine
	metrics *metrics
}

// New builds the module.
func New(cfg Config) (*Module, error) {
	if cfg.DB == nil {
		return nil, errors.New("health: DB is required")
	}
	m := &Module{cfg: cfg, clock: cmp.Or[clock.Clock](cfg.Clock, cfg.DB.Clock()), log: cmp.Or(cfg.Logger, slog.Default())}
	m.metrics = newMetrics(m)
	return m, nil
}

// SetCapacity hands the module capacity's hooks (built after it).
func (m *Module) SetCapacity(c Capacity) { m.cfg.Capacity = c }

// SetFleet hands the module the fleet's signer, notifier and state hook.
func (m *Module) SetFleet(d fleet.Deps) { m.cfg.Fleet = d }

// SetEngine hands the module the provisioning engine its remediation
// workflows run on (the machine lifecycle's, which carries the module's
// profiles).
func (m *Module) SetEngine(e *provision.Engine) { m.engine = e }

// SetEnqueue hands the module the job inserter (built after it).
func (m *Module) SetEnqueue(fn func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error) {
	m.cfg.Enqueue = fn
}

// wake queues a reconcile in tx. Not a unique job: transactions waking it
// would contend on the unique index; a repeated reconcile is harmless.
func (m *Module) wake(ctx context.Context, tx store.Tx) error {
	if m.cfg.Enqueue == nil {
		return nil
	}
	return m.cfg.Enqueue(ctx, tx, ReconcileArgs{}, &river.InsertOpts{MaxAttempts: 3})
}

func (m *Module) events(ctx context.Context, tx store.Tx, evs ...envelope.Event) error {
	if m.cfg.Recorder == nil || len(evs) == 0 {
		return nil
	}
	return m.cfg.Recorder.InsertEvents(ctx, tx, evs)
}

// nodeInfo is what a report needs to know of its node.
type nodeInfo struct {
	node   fleet.Node
	poolID string
	policy *apiv1.PoolPolicy
}

func (m *Module) nodeInfo(ctx context.Context, q store.Querier, nodeID string) (nodeInfo, error) {
	var ni nodeInfo
	n, err := fleet.NodeGet(ctx, q, "", nodeID)
	if err != nil {
		return ni, err
	}
	ni.node = n
	ni.poolID, ni.policy, err = poolOfNode(ctx, q, nodeID)
	return ni, err
}

// poolOfNode reads the pool capacity's membership puts the node in and its
// policy; "" and an empty policy for none.
func poolOfNode(ctx context.Context, q store.Querier, nodeID string) (string, *apiv1.PoolPolicy, error) {
	p, found, err := pool.OfNode(ctx, q, nodeID)
	if err != nil || !found {
		return "", &apiv1.PoolPolicy{}, err
	}
	pol := &apiv1.PoolPolicy{}
	if err := unmarshalPolicy(p.Policy, pol); err != nil {
		return "", nil, fmt.Errorf("pool %s: policy: %w", p.ID, err)
	}
	return p.ID, pol, nil
}

func unmarshalPolicy(s string, p *apiv1.PoolPolicy) error {
	if s == "" {
		return nil
	}
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal([]byte(s), p)
}

// Report records what a node's status report carries, in the transaction
// that records the report: each event (an XID) as a new finding, each
// standing finding once while it stays open (counted on repeats), and —
// when complete — the node's standing findings the report no longer
// carries as resolved. Each new finding takes its pool policy's action.
func (m *Module) Report(ctx context.Context, tx store.Tx, nodeID string, events, findings []*agentv1.HealthEvent, complete bool) error {
	if len(events) == 0 && len(findings) == 0 && !complete {
		return nil
	}
	ni, err := m.nodeInfo(ctx, tx, nodeID)
	if err != nil {
		return err
	}
	now := m.clock.Now()
	var created []Finding
	for _, e := range events {
		if e.GetTime() != nil && e.GetTime().IsValid() {
			seen, err := EventSeen(ctx, tx, nodeID, e.GetDevice(), e.GetKind(), e.GetCode(), e.GetTime().AsTime().UTC().Truncate(time.Microsecond))
			if err != nil {
				return err
			}
			if seen {
				continue // sent again on a new session
			}
		}
		f, err := m.newFinding(ctx, tx, ni, e, false, now)
		if err != nil {
			return err
		}
		created = append(created, f)
	}
	if len(findings) > 0 || complete {
		open, err := FindingList(ctx, tx, FindingsQuery{NodeID: nodeID, State: FindingOpen, Standing: true})
		if err != nil {
			return err
		}
		byKey := map[string]Finding{}
		for _, f := range open {
			byKey[standingKey(f.GPUUUID, f.Kind, f.Code)] = f
		}
		seen := map[string]bool{}
		for _, e := range findings {
			k := standingKey(e.GetDevice(), e.GetKind(), e.GetCode())
			if seen[k] {
				continue
			}
			seen[k] = true
			if f, ok := byKey[k]; ok {
				if err := FindingCount(ctx, tx, f.ID, now); err != nil {
					return err
				}
				continue
			}
			f, err := m.newFinding(ctx, tx, ni, e, true, now)
			if err != nil {
				return err
			}
			created = append(created, f)
		}
		if complete {
			var gone []string
			for k, f := range byKey {
				if !seen[k] {
					gone = append(gone, f.ID)
				}
			}
			if _, err := FindingsResolve(ctx, tx, gone, "node", now); err != nil {
				return err
			}
		}
	}
	for i := range created {
		if err := m.act(ctx, tx, ni, &created[i], now); err != nil {
			return err
		}
	}
	if len(created) > 0 {
		tx.AfterCommit(func() {
			for _, f := range created {
				m.metrics.finding(f.Kind, f.Severity, f.Action)
			}
		})
	}
	return nil
}

func standingKey(gpu, kind string, code int64) string {
	return fmt.Sprintf("%s\x00%s\x00%d", gpu, kind, code)
}

// newFinding writes a finding for e under the node's pool policy.
func (m *Module) newFinding(ctx context.Context, tx store.Tx, ni nodeInfo, e *agentv1.HealthEvent, standing bool, now time.Time) (Finding, error) {
	action := gpuhealth.Action(ni.policy.GetHealth().GetXidActions(), e.GetKind(), e.GetCode())
	if e.GetDevice() == "" && action != gpuhealth.ActionReboot {
		// Nothing to take out of placement but the node itself: a
		// GPU-less finding is recorded.
		action = gpuhealth.ActionRecord
	}
	sev := e.GetSeverity()
	if gpuhealth.SeverityRank(sev) == 0 {
		sev = gpuhealth.Severity(action)
	}
	occur := now
	if e.GetTime() != nil && e.GetTime().IsValid() {
		// Microseconds, as both stores keep them: a repeat compares equal.
		occur = e.GetTime().AsTime().Truncate(time.Microsecond)
	}
	idx := -1
	if e.GpuIndex != nil {
		idx = int(e.GetGpuIndex())
	}
	f := Finding{ID: envelope.NewID(FindingIDPrefix, now), NodeID: ni.node.ID, TenantID: ni.node.TenantID, PoolID: ni.poolID,
		GPUUUID: e.GetDevice(), GPUIndex: idx, Kind: e.GetKind(), Code: e.GetCode(), Severity: sev, Message: clip(e.GetMessage(), 1024),
		PID: e.GetPid(), ProcessName: clip(e.GetProcessName(), 64), Action: action, State: FindingOpen, Standing: standing, Count: 1,
		OccurTime: occur.UTC(), CreateTime: now, UpdateTime: now}
	if err := FindingInsert(ctx, tx, &f); err != nil {
		return f, err
	}
	return f, m.events(ctx, tx, envelope.Event{Type: "health.finding", TenantID: f.TenantID, ResourceType: "Node", ResourceID: f.NodeID, Time: now,
		Data: map[string]any{"finding_id": f.ID, "node": ni.node.Name, "gpu": f.GPUUUID, "kind": f.Kind, "code": f.Code, "severity": f.Severity,
			"action": f.Action, "pool_id": f.PoolID}})
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// act carries out a new finding's action: quarantine (or mark for RMA)
// its GPU, tell the reservations holding it, and for reset and reboot
// queue a remediation of its node.
func (m *Module) act(ctx context.Context, tx store.Tx, ni nodeInfo, f *Finding, now time.Time) error {
	if !gpuhealth.TakesGPUOut(f.Action) {
		return nil
	}
	reason := gpuhealth.Describe(f.Kind, f.Code)
	if f.Message != "" {
		reason += ": " + f.Message
	}
	if f.GPUUUID != "" {
		state := GPUQuarantined
		if f.Action == gpuhealth.ActionRMA {
			state = GPURMA
		}
		if err := m.quarantine(ctx, tx, quarantineParams{node: ni.node, uuid: f.GPUUUID, state: state, reason: reason,
			findingID: f.ID, by: "system:health", move: !ni.policy.GetHealth().GetKeepReservations()}, now); err != nil {
			return err
		}
	}
	if !gpuhealth.Remediates(f.Action) {
		return nil
	}
	if m.repeatedAfterRemedy(ctx, tx, f, now) {
		// The remedy was tried on this GPU within the day and it came
		// back: another reset or reboot would only loop. The node goes to
		// an operator.
		return m.escalateNode(ctx, tx, ni.node, "", f.ID, reason+" came back within a day of a remediation", now)
	}
	return m.queueRemediation(ctx, tx, ni, f, now)
}

// repeatAfterRemedy is how long after a remediation succeeded the same
// GPU's finding counts as the remedy not working.
const repeatAfterRemedy = 24 * time.Hour

func (m *Module) repeatedAfterRemedy(ctx context.Context, tx store.Tx, f *Finding, now time.Time) bool {
	if f.GPUUUID == "" {
		return false
	}
	n, err := RemediationsSucceededSince(ctx, tx, f.NodeID, f.GPUUUID, now.Add(-repeatAfterRemedy))
	return err == nil && n > 0
}

// queueRemediation adds a pending remediation for the finding's node, or
// folds it into the node's active one (a reboot covers a reset).
func (m *Module) queueRemediation(ctx context.Context, tx store.Tx, ni nodeInfo, f *Finding, now time.Time) error {
	cur, ok, err := ActiveRemediation(ctx, tx, ni.node.ID)
	if err != nil {
		return err
	}
	if ok {
		if err := FindingSetRemediation(ctx, tx, f.ID, cur.ID); err != nil {
			return err
		}
		if cur.State == RemPending && cur.Action == gpuhealth.ActionReset && (f.Action == gpuhealth.ActionReboot || f.GPUUUID != cur.GPUUUID) {
			// Two GPUs to reset, or a reboot asked for: one reboot does both.
			cur.Action, cur.GPUUUID, cur.Reason, cur.UpdateTime = gpuhealth.ActionReboot, "", cur.Reason+"; "+gpuhealth.Describe(f.Kind, f.Code), now
			if _, err := RemediationUpdate(ctx, tx, &cur, RemPending); err != nil {
				return err
			}
		}
		return nil
	}
	r := Remediation{ID: envelope.NewID(RemediationIDPrefix, now), NodeID: ni.node.ID, TenantID: ni.node.TenantID, PoolID: ni.poolID,
		Action: f.Action, State: RemPending, Reason: gpuhealth.Describe(f.Kind, f.Code), FindingID: f.ID, CreateTime: now, UpdateTime: now}
	if f.Action == gpuhealth.ActionReset {
		r.GPUUUID = f.GPUUUID
	}
	if err := RemediationInsert(ctx, tx, &r); err != nil {
		return err
	}
	if err := FindingSetRemediation(ctx, tx, f.ID, r.ID); err != nil {
		return err
	}
	if err := m.wake(ctx, tx); err != nil {
		return err
	}
	return m.events(ctx, tx, remEvent("health.remediation_queued", &r, ni.node.Name, now))
}

func remEvent(typ string, r *Remediation, nodeName string, now time.Time) envelope.Event {
	return envelope.Event{Type: typ, TenantID: r.TenantID, ResourceType: "Node", ResourceID: r.NodeID, Time: now,
		Data: map[string]any{"remediation_id": r.ID, "node": nodeName, "gpu": r.GPUUUID, "action": r.Action, "state": r.State,
			"reason": r.Reason, "pool_id": r.PoolID, "workflow_id": r.WorkflowID, "error": r.Error}}
}

// quarantineParams names a GPU to take out of placement.
type quarantineParams struct {
	node              fleet.Node
	uuid, state       string
	reason, findingID string
	by                string
	move              bool
}

// quarantine takes a GPU out of placement: the health_gpus row (RMA wins
// over a plain quarantine) and the node condition capacity reads, then
// tells capacity and the reservations holding it.
func (m *Module) quarantine(ctx context.Context, tx store.Tx, p quarantineParams, now time.Time) error {
	old, err := GPUGet(ctx, tx, p.uuid)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return err
	case old.State == GPURMA || old.State == p.state:
		// Already out, as much or more: nothing moves.
		return nil
	}
	poolID, _, err := poolOfNode(ctx, tx, p.node.ID)
	if err != nil {
		return err
	}
	if err := GPUPut(ctx, tx, &GPU{UUID: p.uuid, NodeID: p.node.ID, TenantID: p.node.TenantID, PoolID: poolID, State: p.state,
		Reason: p.reason, FindingID: p.findingID, CreatedBy: p.by, CreateTime: now}); err != nil {
		return err
	}
	if err := fleet.NodeConditionSet(ctx, tx, &fleet.NodeCondition{NodeID: p.node.ID, Type: ConditionGPUQuarantinedPrefix + p.uuid,
		Status: "true", Reason: conditionReason(p.state, p.reason), Message: p.reason}); err != nil {
		return err
	}
	if c := m.cfg.Capacity; c != nil {
		if err := c.NodeChanged(ctx, tx, p.node.ID); err != nil {
			return err
		}
		held, moved, err := c.GPUUnhealthy(ctx, tx, p.node.ID, p.uuid, p.reason, p.move)
		if err != nil {
			return err
		}
		if held > 0 {
			m.log.Info("reservations on a bad GPU", "node", p.node.Name, "gpu", p.uuid, "held", held, "moved", moved)
		}
	}
	tx.AfterCommit(func() { m.metrics.quarantined(p.state) })
	return m.events(ctx, tx, envelope.Event{Type: "gpu.quarantined", TenantID: p.node.TenantID, ResourceType: "Node", ResourceID: p.node.ID, Time: now,
		Data: map[string]any{"node": p.node.Name, "gpu": p.uuid, "state": p.state, "reason": p.reason, "finding_id": p.findingID, "by": p.by}})
}

// conditionReason is the condition's machine reason: XID79, RMA, ...
func conditionReason(state, reason string) string {
	if state == GPURMA {
		return "RMA"
	}
	var code int64
	if _, err := fmt.Sscanf(reason, "XID %d", &code); err == nil {
		return fmt.Sprintf("XID%d", code)
	}
	return "Quarantined"
}

// lift puts a GPU back in placement: its row goes, its condition turns
// false, and its open findings are resolved. It returns how many findings
// it resolved; a GPU in service is left as it is.
func (m *Module) lift(ctx context.Context, tx store.Tx, node fleet.Node, uuid, by, reason string, now time.Time) (int, error) {
	if err := GPUDelete(ctx, tx, uuid); err != nil {
		return 0, err
	}
	if err := fleet.NodeConditionSet(ctx, tx, &fleet.NodeCondition{NodeID: node.ID, Type: ConditionGPUQuarantinedPrefix + uuid,
		Status: "false", Reason: "Lifted", Message: reason}); err != nil {
		return 0, err
	}
	open, err := FindingList(ctx, tx, FindingsQuery{NodeID: node.ID, GPUUUID: uuid, State: FindingOpen})
	if err != nil {
		return 0, err
	}
	ids := make([]string, len(open))
	for i, f := range open {
		ids[i] = f.ID
	}
	n, err := FindingsResolve(ctx, tx, ids, by, now)
	if err != nil {
		return n, err
	}
	if c := m.cfg.Capacity; c != nil {
		if err := c.NodeChanged(ctx, tx, node.ID); err != nil {
			return n, err
		}
	}
	return n, m.events(ctx, tx, envelope.Event{Type: "gpu.lifted", TenantID: node.TenantID, ResourceType: "Node", ResourceID: node.ID, Time: now,
		Data: map[string]any{"node": node.Name, "gpu": uuid, "reason": reason, "by": by, "resolved_findings": n}})
}

// escalateNode sends a node to maintenance: drained (if it was not), the
// Maintenance condition set, and an event for the operator.
func (m *Module) escalateNode(ctx context.Context, tx store.Tx, node fleet.Node, remID, findingID, why string, now time.Time) error {
	if _, err := fleet.SystemDrain(ctx, tx, m.cfg.Fleet, m.cfg.Recorder, node.ID, "health: "+why, "system:health", now); err != nil {
		return err
	}
	if err := fleet.NodeConditionSet(ctx, tx, &fleet.NodeCondition{NodeID: node.ID, Type: ConditionMaintenance, Status: "true",
		Reason: "RemediationEscalated", Message: clip(why, 512)}); err != nil {
		return err
	}
	tx.AfterCommit(func() { m.metrics.escalated() })
	return m.events(ctx, tx, envelope.Event{Type: "health.node_maintenance", TenantID: node.TenantID, ResourceType: "Node", ResourceID: node.ID, Time: now,
		Data: map[string]any{"node": node.Name, "reason": why, "remediation_id": remID, "finding_id": findingID}})
}
