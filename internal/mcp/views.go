package mcp

import (
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// The views below are what tools and resources answer: the API's messages
// with the fields an agent acts on, times as RFC 3339 strings, so their
// JSON schemas stay small and readable.

// Pool is a pool an agent may reserve from.
type Pool struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Owner string `json:"owner,omitempty" jsonschema:"the owning tenant; a pool of another tenant is reserved as owner/name"`
	State string `json:"state" jsonschema:"active or archived"`
	// Offer says who besides the owner may reserve from it.
	OfferScope   string   `json:"offer_scope,omitempty" jsonschema:"private (the owner only), all or tenants (those listed)"`
	OfferTenants []string `json:"offer_tenants,omitempty"`
	GPUSharing   string   `json:"gpu_sharing,omitempty" jsonschema:"exclusive, mig, timeslice or mps"`
	MaxDuration  int64    `json:"max_duration_seconds,omitempty"`
}

func poolOf(p *apiv1.Pool) Pool {
	return Pool{ID: p.GetId(), Name: p.GetName(), Owner: p.GetOwner(), State: p.GetState(),
		OfferScope: p.GetOffer().GetScope(), OfferTenants: p.GetOffer().GetTenants(),
		GPUSharing: p.GetPolicy().GetGpuSharing(), MaxDuration: p.GetPolicy().GetMaxDurationSeconds()}
}

// CapacityRow is one pool and model's GPUs.
type CapacityRow struct {
	Pool        string `json:"pool"`
	PoolID      string `json:"pool_id"`
	Model       string `json:"model"`
	Kind        string `json:"kind" jsonschema:"gpu, mig or slot"`
	Total       int32  `json:"total"`
	Booked      int32  `json:"booked"`
	Quarantined int32  `json:"quarantined"`
	Free        int32  `json:"free"`
	Pending     int32  `json:"pending" jsonschema:"requested by reservations waiting for capacity"`
}

func capacityRowOf(r *apiv1.CapacityRow) CapacityRow {
	return CapacityRow{Pool: r.GetPool(), PoolID: r.GetPoolId(), Model: r.GetModel(), Kind: r.GetKind(), Total: r.GetTotal(),
		Booked: r.GetBooked(), Quarantined: r.GetQuarantined(), Free: r.GetFree(), Pending: r.GetPending()}
}

// Reservation is a GPU reservation.
type Reservation struct {
	ID          string       `json:"id"`
	Tenant      string       `json:"tenant,omitempty"`
	ProjectID   string       `json:"project_id"`
	Pool        string       `json:"pool"`
	PoolID      string       `json:"pool_id"`
	State       string       `json:"state" jsonschema:"pending, placed, binding, active, releasing, released, expired, failed or canceled; releasing: a kubernetes binding whose GPUs stay booked and billed until the node's pods let go"`
	GPUs        int32        `json:"gpus,omitempty"`
	Model       string       `json:"model,omitempty"`
	MIGProfile  string       `json:"mig_profile,omitempty"`
	Slots       int32        `json:"slots,omitempty"`
	VCPU        int32        `json:"vcpu,omitempty"`
	MemoryGiB   int32        `json:"memory_gib,omitempty"`
	Binding     string       `json:"binding,omitempty"`
	Start       string       `json:"start"`
	End         string       `json:"end" jsonschema:"the booking's end; a releasing reservation's moves in 5-minute steps while pods still hold its GPUs"`
	ReleaseTime string       `json:"release_time,omitempty" jsonschema:"when a kubernetes binding began releasing"`
	Placement   *Placement   `json:"placement,omitempty"`
	Explanation *Explanation `json:"explanation,omitempty" jsonschema:"why a pending reservation is not placed yet"`
	CreatedBy   string       `json:"created_by"`
}

func reservationValue(r *apiv1.Reservation) Reservation {
	sp := r.GetSpec()
	return Reservation{ID: r.GetId(), Tenant: r.GetTenant(), ProjectID: r.GetProjectId(), Pool: r.GetPool(), PoolID: r.GetPoolId(),
		State: r.GetState(), GPUs: sp.GetGpus(), Model: sp.GetModel(), MIGProfile: sp.GetMigProfile(), Slots: sp.GetSlots(),
		VCPU: sp.GetVcpu(), MemoryGiB: sp.GetMemoryGib(), Binding: sp.GetBinding(),
		Start: timeOf(r.GetStartTime()), End: timeOf(r.GetEndTime()), ReleaseTime: timeOf(r.GetReleaseTime()), Placement: placementOf(r.GetPlacement()),
		Explanation: explanationOf(r.GetExplanation()), CreatedBy: r.GetCreatedBy()}
}

func reservationOf(r *apiv1.Reservation) *Reservation {
	if r == nil {
		return nil
	}
	v := reservationValue(r)
	return &v
}

// Placement is where a reservation landed.
type Placement struct {
	NodeID   string   `json:"node_id"`
	NodeName string   `json:"node_name"`
	GPUModel string   `json:"gpu_model,omitempty"`
	Atoms    []string `json:"atoms,omitempty" jsonschema:"the GPUs, MIG instances or slots booked"`
	NUMA     int32    `json:"numa"`
	CPUSet   string   `json:"cpuset,omitempty"`
}

func placementOf(p *apiv1.Placement) *Placement {
	if p == nil || p.GetNodeId() == "" {
		return nil
	}
	return &Placement{NodeID: p.GetNodeId(), NodeName: p.GetNodeName(), GPUModel: p.GetGpuModel(), Atoms: p.GetAtoms(),
		NUMA: p.GetNuma(), CPUSet: p.GetCpuset()}
}

// Explanation says why nodes did or did not fit, by node class.
type Explanation struct {
	Evaluated int32             `json:"evaluated" jsonschema:"nodes looked at"`
	Feasible  int32             `json:"feasible" jsonschema:"nodes that would fit"`
	Summary   string            `json:"summary"`
	Lines     []ExplanationLine `json:"lines"`
}

// ExplanationLine is one node class and why its nodes were refused.
type ExplanationLine struct {
	Class  string `json:"class" jsonschema:"the node class, e.g. the GPU model and count"`
	Reason string `json:"reason"`
	Nodes  int32  `json:"nodes"`
}

func explanationOf(e *apiv1.Explanation) *Explanation {
	if e == nil {
		return nil
	}
	out := &Explanation{Evaluated: e.GetEvaluated(), Feasible: e.GetFeasible(), Summary: e.GetSummary(), Lines: []ExplanationLine{}}
	for _, l := range e.GetLines() {
		out.Lines = append(out.Lines, ExplanationLine{Class: l.GetClass(), Reason: l.GetReason(), Nodes: l.GetNodes()})
	}
	return out
}

// Quota is what a request does to the quotas that cover it.
type Quota struct {
	Exceeded bool       `json:"exceeded"`
	Uses     []QuotaUse `json:"uses"`
}

// QuotaUse is one quota's limit, use and the request's share.
type QuotaUse struct {
	QuotaID           string  `json:"quota_id"`
	Scope             string  `json:"scope"`
	GPUsLimit         int32   `json:"gpus_limit"`
	GPUsUsed          int32   `json:"gpus_used"`
	GPUsRequested     int32   `json:"gpus_requested"`
	GPUHoursLimit     float64 `json:"gpu_hours_limit"`
	GPUHoursUsed      float64 `json:"gpu_hours_used"`
	GPUHoursRequested float64 `json:"gpu_hours_requested"`
	Exceeded          bool    `json:"exceeded"`
}

func quotaOf(q *apiv1.QuotaEffect) *Quota {
	if q == nil {
		return nil
	}
	out := &Quota{Exceeded: q.GetExceeded(), Uses: []QuotaUse{}}
	for _, u := range q.GetUses() {
		out.Uses = append(out.Uses, QuotaUse{QuotaID: u.GetQuotaId(), Scope: u.GetScope(), GPUsLimit: u.GetGpusLimit(),
			GPUsUsed: u.GetGpusUsed(), GPUsRequested: u.GetGpusRequested(), GPUHoursLimit: u.GetGpuHoursLimit(),
			GPUHoursUsed: u.GetGpuHoursUsed(), GPUHoursRequested: u.GetGpuHoursRequested(), Exceeded: u.GetExceeded()})
	}
	return out
}

// Node is a GPU host.
type Node struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	ProjectID     string `json:"project_id"`
	Pool          string `json:"pool,omitempty"`
	State         string `json:"state" jsonschema:"joining, active, draining, drained or retired"`
	Liveness      string `json:"liveness" jsonschema:"ready, unreachable or lost"`
	GPUCount      int32  `json:"gpu_count"`
	GPUModel      string `json:"gpu_model,omitempty"`
	LastHeartbeat string `json:"last_heartbeat,omitempty"`
}

func nodeOf(n *apiv1.Node) Node {
	return Node{ID: n.GetId(), Name: n.GetName(), ProjectID: n.GetProjectId(), Pool: n.GetPool(), State: n.GetState(),
		Liveness: n.GetLiveness(), GPUCount: n.GetGpuCount(), GPUModel: n.GetGpuModel(), LastHeartbeat: timeOf(n.GetLastHeartbeat())}
}

// UsageWindow is one hour of one metric of one reservation.
type UsageWindow struct {
	ProjectID     string  `json:"project_id"`
	ReservationID string  `json:"reservation_id"`
	Metric        string  `json:"metric"`
	WindowStart   string  `json:"window_start"`
	Quantity      float64 `json:"quantity"`
	Partial       bool    `json:"partial" jsonschema:"the window is still open"`
}

func usageOf(w *apiv1.UsageWindow) UsageWindow {
	return UsageWindow{ProjectID: w.GetProjectId(), ReservationID: w.GetReservationId(), Metric: w.GetMetric(),
		WindowStart: timeOf(w.GetWindowStart()), Quantity: w.GetQuantity(), Partial: w.GetPartial()}
}

// CommandBatch is a proposed batch as an agent sees it.
type CommandBatch struct {
	ID            string      `json:"id"`
	State         string      `json:"state" jsonschema:"pending, approved, ran, canceled or expired"`
	Root          string      `json:"root" jsonschema:"the Merkle root approvers sign, hex"`
	Threshold     int32       `json:"threshold" jsonschema:"how many approver signatures it needs"`
	ApproverEpoch int64       `json:"approver_epoch"`
	ExpireTime    string      `json:"expire_time"`
	Leaves        []BatchLeaf `json:"leaves"`
}

// BatchLeaf is one command of a batch.
type BatchLeaf struct {
	Kind         string `json:"kind"`
	Subject      string `json:"subject"`
	ParamsSHA256 string `json:"params_sha256"`
}

func batchOf(b *apiv1.CommandBatch) *CommandBatch {
	if b == nil {
		return nil
	}
	out := &CommandBatch{ID: b.GetId(), State: b.GetState(), Root: b.GetRoot(), Threshold: b.GetThreshold(),
		ApproverEpoch: b.GetApproverEpoch(), ExpireTime: timeOf(b.GetExpireTime()), Leaves: []BatchLeaf{}}
	for _, l := range b.GetLeaves() {
		out.Leaves = append(out.Leaves, BatchLeaf{Kind: l.GetKind(), Subject: l.GetSubject(), ParamsSHA256: l.GetParamsSha256()})
	}
	return out
}
