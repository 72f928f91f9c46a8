package health

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/gpuhealth"
	"github.com/better-compute/better-compute/internal/store"
)

// GPURef is a GPU of the fleet as the gpus table knows it.
type GPURef struct {
	UUID   string
	NodeID string
	Index  int
	Model  string
}

// GPUByUUID reads a GPU; store.ErrNotFound when no node reports it.
func GPUByUUID(ctx context.Context, q store.Querier, uuid string) (GPURef, error) {
	g, err := fleet.GPUByUUID(ctx, q, uuid)
	return GPURef{UUID: g.UUID, NodeID: g.NodeID, Index: g.Index, Model: g.Model}, err
}

// NodeGPUs lists a node's GPUs by index.
func NodeGPUs(ctx context.Context, q store.Querier, nodeID string) ([]GPURef, error) {
	gs, err := fleet.GPUList(ctx, q, nodeID)
	out := make([]GPURef, len(gs))
	for i, g := range gs {
		out[i] = GPURef{UUID: g.UUID, NodeID: nodeID, Index: g.Index, Model: g.Model}
	}
	return out, err
}

// QuarantineGPU is an operator's quarantine of one GPU of node, in the
// caller's transaction (the caller authorizes and audits): a gpu.quarantine
// finding and the GPU out of placement; the node stays schedulable and the
// reservations holding the GPU are told but not moved.
func (m *Module) QuarantineGPU(ctx context.Context, tx store.Tx, node fleet.Node, g GPURef, reason string, rma bool, by string) (Finding, error) {
	now := m.clock.Now()
	poolID, _, err := poolOfNode(ctx, tx, node.ID)
	if err != nil {
		return Finding{}, err
	}
	action, state := gpuhealth.ActionQuarantine, GPUQuarantined
	if rma {
		action, state = gpuhealth.ActionRMA, GPURMA
	}
	f := Finding{ID: envelope.NewID(FindingIDPrefix, now), NodeID: node.ID, TenantID: node.TenantID, PoolID: poolID, GPUUUID: g.UUID,
		GPUIndex: g.Index, Kind: gpuhealth.KindQuarantine, Severity: gpuhealth.Severity(action), Message: clip(reason, 1024),
		Action: action, State: FindingOpen, Count: 1, OccurTime: now, CreateTime: now, UpdateTime: now}
	if err := FindingInsert(ctx, tx, &f); err != nil {
		return f, err
	}
	err = m.quarantine(ctx, tx, quarantineParams{node: node, uuid: g.UUID, state: state, reason: reason, findingID: f.ID, by: by}, now)
	return f, err
}

// LiftGPU is an operator's lift of a GPU's quarantine, in the caller's
// transaction (the caller authorizes and audits): the GPU rejoins
// placement and its open findings are resolved. It returns how many.
func (m *Module) LiftGPU(ctx context.Context, tx store.Tx, node fleet.Node, g GPURef, reason, by string) (int, error) {
	return m.lift(ctx, tx, node, g.UUID, by, reason, m.clock.Now())
}

// Now is the module's clock.
func (m *Module) Now() time.Time { return m.clock.Now() }
