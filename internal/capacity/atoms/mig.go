package atoms

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/gpumodel"
	"github.com/better-compute/better-compute/internal/capacity/migplan"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// ConditionGPUPartitionPending starts the node condition that freezes one
// GPU while its MIG layout changes: "GpuPartitionPending/<uuid>", status
// true, its message the layout asked for (migplan.Key). The GPU's atoms are
// partition pending, so nothing books them, until the node's inventory
// shows that layout; the reconcile then clears the condition.
const ConditionGPUPartitionPending = "GpuPartitionPending/"

// ReasonMIGRepartition is the reason of the condition FreezeGPU sets.
const ReasonMIGRepartition = "MigRepartition"

// ErrGPUBusy is a freeze refused because a booking of one of the GPU's
// atoms ends after now.
var ErrGPUBusy = errors.New("the GPU has bookings")

// MIGGPU is one GPU of a pool as the MIG repartitioner sees it.
type MIGGPU struct {
	NodeID, TenantID, UUID string
	// Model is the canonical model ("H100 80GB").
	Model string
	// Layout is the profile of each MIG instance the inventory reports.
	Layout []string
	// Booked is set when a booking of one of its atoms ends after now.
	Booked bool
	// Quarantined and Pending take the GPU out of placement; Target and
	// PendingSince say what a GpuPartitionPending condition asks for and
	// since when.
	Quarantined, Pending bool
	Target               string
	PendingSince         time.Time
}

// PoolMIGGPUs lists the GPUs of a pool's nodes with their MIG layouts, what
// holds them and whether they are frozen. It reads; the freeze itself
// re-checks in its own transaction.
func PoolMIGGPUs(ctx context.Context, q store.Querier, poolID string, now time.Time) ([]MIGGPU, error) {
	nodes, err := poolNodes(ctx, q, poolID)
	if err != nil {
		return nil, fmt.Errorf("nodes of pool %s: %w", poolID, err)
	}
	bookings, _, err := booking.Current(ctx, q, poolID, now)
	if err != nil {
		return nil, err
	}
	bookedGPU := map[string]bool{}
	for _, b := range bookings {
		u, _, _ := strings.Cut(b.Atom, "/")
		bookedGPU[u] = true
	}
	var out []MIGGPU
	for _, nodeID := range nodes {
		n, err := readNode(ctx, q, nodeID)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		gpus, err := readGPUs(ctx, q, nodeID)
		if err != nil {
			return nil, err
		}
		mig, err := readMIG(ctx, q, nodeID)
		if err != nil {
			return nil, err
		}
		conds, err := gpuConditions(ctx, q, nodeID)
		if err != nil {
			return nil, err
		}
		for _, g := range gpus {
			m := MIGGPU{NodeID: nodeID, TenantID: n.TenantID, UUID: g.UUID, Model: gpumodel.Canonical(g.Model, g.MemMiB),
				Booked: bookedGPU[g.UUID], Quarantined: conds.quarantined[g.UUID], Pending: g.MigMode == "pending"}
			if c, ok := conds.pending[g.UUID]; ok {
				m.Pending, m.Target, m.PendingSince = true, c.Message, c.UpdateTime
			}
			for _, f := range mig[g.UUID] {
				m.Layout = append(m.Layout, f.Profile)
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// FreezeGPU marks a GPU partition pending for a change to layout, in the
// transaction that re-checks, under the node's lock (which a placer batch
// takes before it books there), that no booking of its atoms ends after
// now; a booked GPU is refused with ErrGPUBusy and nothing is written. The
// node is reconciled in the same transaction, so its atoms are frozen and
// its pool's placer told before the transaction commits.
func (rc *Reconciler) FreezeGPU(ctx context.Context, tx store.Tx, nodeID, uuid string, layout []string, now time.Time) error {
	return rc.withNode(ctx, tx, nodeID, func(ctx context.Context) error {
		have, err := readAtoms(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		var ids []string
		for id, a := range have {
			if a.GPUUUID == uuid {
				ids = append(ids, id)
			}
		}
		booked, err := booking.BookedAfter(ctx, tx, ids, now)
		if err != nil {
			return err
		}
		if booked {
			return fmt.Errorf("freeze GPU %s of node %s: %w", uuid, nodeID, ErrGPUBusy)
		}
		return fleet.NodeConditionSet(ctx, tx, &fleet.NodeCondition{NodeID: nodeID, Type: ConditionGPUPartitionPending + uuid,
			Status: "true", Reason: ReasonMIGRepartition, Message: migplan.Key(layout)})
	})
}

// ThawGPU clears a GPU's GpuPartitionPending condition whatever its
// layout (a change that failed or never came) and reconciles the node.
func (rc *Reconciler) ThawGPU(ctx context.Context, tx store.Tx, nodeID, uuid string) error {
	return rc.withNode(ctx, tx, nodeID, func(ctx context.Context) error {
		return fleet.NodeConditionUpdate(ctx, tx, &fleet.NodeCondition{NodeID: nodeID, Type: ConditionGPUPartitionPending + uuid,
			Status: "false", Reason: ReasonMIGRepartition, Message: "thawed"})
	})
}

// withNode runs change under the tenant's reconcile lock and the node's
// lock (in that order, as every reconcile takes them), then reconciles the
// node.
func (rc *Reconciler) withNode(ctx context.Context, tx store.Tx, nodeID string, change func(ctx context.Context) error) error {
	n, err := readNode(ctx, tx, nodeID)
	if err != nil {
		return err
	}
	if err := reconcileLock(ctx, tx, n.TenantID); err != nil {
		return err
	}
	if err := lockNode(ctx, tx, nodeID); err != nil {
		return err
	}
	if err := change(ctx); err != nil {
		return err
	}
	pools, err := readPools(ctx, tx, n.TenantID)
	if err != nil {
		return err
	}
	woken, err := rc.reconcile(ctx, tx, nodeID, pools, nil)
	if err != nil {
		return err
	}
	return rc.wake(ctx, tx, woken)
}

// gpuFlags is what a node's conditions say of its GPUs.
type gpuFlags struct {
	quarantined map[string]bool
	pending     map[string]fleet.NodeCondition
}

func gpuConditions(ctx context.Context, q store.Querier, nodeID string) (gpuFlags, error) {
	conds, err := fleet.NodeConditionList(ctx, q, nodeID)
	if err != nil {
		return gpuFlags{}, err
	}
	out := gpuFlags{quarantined: map[string]bool{}, pending: map[string]fleet.NodeCondition{}}
	for _, c := range conds[nodeID] {
		if c.Status != "true" {
			continue
		}
		if u, ok := strings.CutPrefix(c.Type, conditionGPUQuarantined); ok {
			out.quarantined[u] = true
		}
		if u, ok := strings.CutPrefix(c.Type, ConditionGPUPartitionPending); ok {
			out.pending[u] = c
		}
	}
	return out, nil
}

// landedPartitions clears the GpuPartitionPending condition of each GPU
// whose inventory now shows the layout asked for, and returns the GPUs
// still frozen.
func landedPartitions(ctx context.Context, tx store.Tx, nodeID string, gpus []gpuFacts, flags gpuFlags) (map[string]bool, error) {
	if len(flags.pending) == 0 {
		return nil, nil
	}
	mig, err := readMIG(ctx, tx, nodeID)
	if err != nil {
		return nil, err
	}
	frozen := map[string]bool{}
	for _, g := range gpus {
		c, ok := flags.pending[g.UUID]
		if !ok {
			continue
		}
		var layout []string
		for _, f := range mig[g.UUID] {
			layout = append(layout, f.Profile)
		}
		if g.MigMode == "enabled" && migplan.Key(layout) == c.Message {
			if err := fleet.NodeConditionUpdate(ctx, tx, &fleet.NodeCondition{NodeID: nodeID, Type: c.Type, Status: "false",
				Reason: ReasonMIGRepartition, Message: "landed: " + c.Message}); err != nil {
				return nil, err
			}
			continue
		}
		frozen[g.UUID] = true
	}
	return frozen, nil
}
