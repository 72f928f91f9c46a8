package fleet

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// InventoryService serves the InventoryService API.
type InventoryService struct {
	env *envelope.Envelope
}

// NewInventoryService returns the inventory handlers.
func NewInventoryService(env *envelope.Envelope) *InventoryService {
	return &InventoryService{env: env}
}

var _ apiv1connect.InventoryServiceHandler = (*InventoryService)(nil)

// Get reads what a node's agent last reported about its hardware.
func (s *InventoryService) Get(ctx context.Context, req *connect.Request[apiv1.GetInventoryRequest]) (*connect.Response[apiv1.GetInventoryResponse], error) {
	var vs envelope.Violations
	validateTenant(&vs, req.Msg.GetTenant())
	validateNode(&vs, "node", req.Msg.GetNode())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		r   nodeRef
		inv Inventory
	)
	if err := s.env.Resolve(ctx, "node", func(ctx context.Context, q store.Querier) (err error) {
		if r, err = lookupNode(ctx, q, req.Msg.GetTenant(), req.Msg.GetNode()); err != nil || !r.found {
			return err
		}
		inv, err = InventoryGet(ctx, q, r.node.ID)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return nil, err
	}
	if err := r.notFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(InventoryProto(inv)), nil
}

// InventoryProto converts an inventory for the API.
func InventoryProto(inv Inventory) *apiv1.GetInventoryResponse {
	out := &apiv1.GetInventoryResponse{NodeId: inv.NodeID, Digest: inv.Digest}
	for _, g := range inv.GPUs {
		pg := &apiv1.Gpu{Uuid: g.UUID, Index: int32(g.Index), Model: g.Model, MemoryMib: g.MemoryMiB, PciBusId: g.PCIBusID,
			NumaNode: int32(g.NumaNode), MigMode: g.MigMode}
		for _, m := range g.MigInstances {
			pg.MigInstances = append(pg.MigInstances, &apiv1.MigInstance{Uuid: m.UUID, Profile: m.Profile,
				GpuInstanceId: int32(m.GPUInstanceID), MemoryMib: m.MemoryMiB})
		}
		out.Gpus = append(out.Gpus, pg)
	}
	for _, l := range inv.NvLinks {
		out.Nvlinks = append(out.Nvlinks, &apiv1.NvLink{GpuUuid: l.GPUUUID, PeerUuid: l.PeerUUID, Link: int32(l.Link)})
	}
	for _, n := range inv.NumaNodes {
		out.NumaNodes = append(out.NumaNodes, &apiv1.NumaNode{Id: int32(n.ID), Cpus: n.CPUs, MemoryMib: n.MemoryMiB,
			Hugepages_2Mi: n.Hugepages2Mi, Hugepages_1Gi: n.Hugepages1Gi})
	}
	if r := inv.Resources; r != nil {
		out.Resources = &apiv1.NodeResources{CpuModel: r.CPUModel, Sockets: int32(r.Sockets), Cores: int32(r.Cores),
			Threads: int32(r.Threads), MemoryMib: r.MemoryMiB, Hugepages_2MiTotal: r.Hugepages2MiTotal,
			Hugepages_1GiTotal: r.Hugepages1GiTotal, UpdateTime: timestamppb.New(r.UpdateTime)}
	}
	for _, c := range inv.Conditions {
		out.Conditions = append(out.Conditions, ConditionProto(c))
	}
	return out
}
