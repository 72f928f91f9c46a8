package reservation

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
)

// CheckInstanceFits refuses, in the pool's placer batch (SubmitInstance),
// an instance no host of the pool (or, with a NodeID, that node) could ever
// hold, whatever is booked now; it books nothing. A sandbox template is checked with it once, so its
// sandboxes later fail only for capacity.
func (e *Engine) CheckInstanceFits(ctx context.Context, ib InstanceBooking) error {
	b := placer.BatchOf(ctx)
	if b == nil {
		return errors.New("reservation: CheckInstanceFits outside the pool's placer (use SubmitInstance)")
	}
	p, err := b.LockPool(ctx, ib.PoolID)
	if err != nil {
		return envelope.FromStore(err, "pool")
	}
	if p.State != pool.StateActive {
		return envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s is archived", p.Name)
	}
	if ib.GPUs == 0 && (ib.VCPU <= 0 || ib.MemoryGiB+ib.Hugepages1Gi <= 0) {
		return envelope.Invalid(envelope.Violation{Field: cmpField(ib.Field, "flavor"), Reason: "a guest without GPUs must ask for vCPUs and memory"})
	}
	r := Reservation{TenantID: ib.TenantID, PoolID: p.ID, GPUs: ib.GPUs, Model: strings.ToUpper(ib.Model), VCPU: ib.VCPU,
		MemoryGiB: ib.MemoryGiB, Hugepages1Gi: ib.Hugepages1Gi, Binding: BindingInstance, SingleTenant: poolPolicy(*p).GetSingleTenant(),
		Placement: PlacementRecord{NUMA: -1, Island: -1}, Flavor: ib.Flavor, PinNodeID: ib.NodeID}
	nodes := placer.Pristine(b.Index().Static().Nodes)
	res, err := placement.Place(placement.NewSnapshot(slices.Clone(nodes)), placer.Request(&r), placement.Options{Limit: 1})
	if err != nil {
		var re *placement.RequestError
		if errors.As(err, &re) {
			return envelope.Invalid(envelope.Violation{Field: cmpField(ib.Field, "flavor"), Reason: re.Reason})
		}
		return err
	}
	if len(res.Plans) == 0 {
		return placer.NeverFits(p.Name, nodes, &r, res.Explanation)
	}
	return nil
}
