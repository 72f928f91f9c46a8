package reservation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// InstanceHorizon is how far an instance's reservation reaches: a guest
// holds its host until it is deleted, so its window is open-ended in
// practice (deleting it ends the window at once, which is what usage
// meters).
const InstanceHorizon = 10 * 365 * 24 * time.Hour

// InstanceBooking is what the instance service (internal/vps) asks of
// capacity for one guest. It is booked in the instance's own transaction,
// under the instance service's one authorization decision: there is no
// reservation RPC and no decision of its own.
type InstanceBooking struct {
	TenantID string
	// ProjectID: empty takes the tenant's default project (as a
	// reservation's create does).
	ProjectID string
	PoolID    string
	// VCPU and MemoryGiB are required when GPUs is 0.
	VCPU, MemoryGiB, Hugepages1Gi int
	GPUs                          int
	Model                         string
	CreatedBy                     string
	// Flavor names the instance's flavor, for usage.
	Flavor string
	// Field names the request field the pool came from, for refusals.
	Field string
	// Requires are host capabilities the guest needs (its network policy).
	Requires []string
	// NodeID books on this node only ("" on any node of the pool): a
	// sandbox from a snapshot boots where the snapshot's files are.
	NodeID string
}

// ResolveInstancePool finds the pool an instance places in: the one the
// request names (the tenant's own or one offered to it) or, when it names
// none, the only pool the tenant sees. found is false (nil error) when
// there is none, for the caller to answer NOT_FOUND after its decision.
func ResolveInstancePool(ctx context.Context, q store.Querier, tenantID, ref string) (pool.Pool, bool, error) {
	if ref != "" {
		p, found, amb, err := pool.ResolveVisible(ctx, q, tenantID, ref)
		if err != nil {
			return p, false, err
		}
		if amb != nil {
			return p, false, amb.Err()
		}
		return p, found, nil
	}
	ps, err := pool.ListVisible(ctx, q, tenantID, 2)
	if err != nil || len(ps) != 1 {
		return pool.Pool{}, false, err
	}
	return ps[0], true, nil
}

// SubmitInstance runs an instance mutation in the pool's placer, writing as
// it goes (the envelope's Mutation.Submit): its booking never races the
// pool's other placements.
func (e *Engine) SubmitInstance(ctx context.Context, poolID, tenantID string, write func(ctx context.Context, b *envelope.Batch) error) error {
	return e.placers.SubmitMutation(ctx, poolID, tenantID, true, write)
}

// BookInstance places and books an instance's reservation now, in the
// transaction of the placer batch SubmitInstance opened, and returns it
// active with the events to record. Instances do not queue: when nothing
// fits now the create is refused (NO_CAPACITY), and a request no host of
// the pool could ever hold says so (FAILED_PRECONDITION), so nothing is
// written for a guest that will not boot.
func (e *Engine) BookInstance(ctx context.Context, tx store.Tx, ib InstanceBooking, now time.Time) (*Reservation, []envelope.Event, error) {
	b := placer.BatchOf(ctx)
	if b == nil {
		return nil, nil, errors.New("reservation: BookInstance outside the pool's placer (use SubmitInstance)")
	}
	p, err := b.LockPool(ctx, ib.PoolID)
	if err != nil {
		return nil, nil, envelope.FromStore(err, "pool")
	}
	if p.State != pool.StateActive {
		return nil, nil, envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s is archived", p.Name)
	}
	if ib.GPUs == 0 && (ib.VCPU <= 0 || ib.MemoryGiB+ib.Hugepages1Gi <= 0) {
		return nil, nil, envelope.Invalid(envelope.Violation{Field: "flavor", Reason: "a guest without GPUs must ask for vCPUs and memory"})
	}
	projectID := ib.ProjectID
	if projectID == "" {
		pr, err := defaultProject(ctx, tx, ib.TenantID, "")
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil, nil, envelope.Errorf(envelope.CodeFailedPrecondition, "tenant has no project to book the instance in: create one")
		case errors.Is(err, errNoDefaultProject):
			return nil, nil, envelope.Invalid(envelope.Violation{Field: "project", Reason: err.Error()})
		case err != nil:
			return nil, nil, err
		}
		projectID = pr.ID
	} else if _, err := tenancy.ProjectGet(ctx, tx, ib.TenantID, projectID); err != nil {
		return nil, nil, envelope.FromStore(err, "project")
	}
	start := now.UTC().Truncate(booking.Resolution)
	r := Reservation{
		ID: envelope.NewID(IDPrefix, now), TenantID: ib.TenantID, ProjectID: projectID, PoolID: p.ID, State: StatePending,
		GPUs: ib.GPUs, Model: strings.ToUpper(ib.Model), VCPU: ib.VCPU, MemoryGiB: ib.MemoryGiB, Hugepages1Gi: ib.Hugepages1Gi,
		Binding: BindingInstance, SingleTenant: poolPolicy(*p).GetSingleTenant(), StartsAt: start, EndsAt: start.Add(InstanceHorizon),
		Placement: PlacementRecord{NUMA: -1, Island: -1}, Explanation: "{}", CreatedBy: ib.CreatedBy, CreateTime: now, UpdateTime: now, Flavor: ib.Flavor,
		Requires: ib.Requires, PinNodeID: ib.NodeID,
	}
	placed, ex, err := e.placers.Place(ctx, b, &r, now)
	if err != nil {
		var re *placement.RequestError
		if errors.As(err, &re) {
			return nil, nil, envelope.Invalid(envelope.Violation{Field: cmpField(ib.Field, "flavor"), Reason: re.Reason})
		}
		return nil, nil, err
	}
	if !placed {
		static := b.Index().Static()
		nodes := placer.Pristine(static.Nodes)
		again, err := placement.Place(placement.NewSnapshot(slices.Clone(nodes)), placer.Request(&r), placement.Options{Limit: 1})
		if err != nil {
			return nil, nil, err
		}
		if len(again.Plans) == 0 {
			return nil, nil, placer.NeverFits(p.Name, nodes, &r, ex)
		}
		if r.PinNodeID != "" {
			name := r.PinNodeID
			if n := static.Nodes[r.PinNodeID]; n != nil && n.Name != "" {
				name = n.Name
			}
			return nil, nil, pinnedNoCapacity(p.Name, name, ex)
		}
		return nil, nil, noCapacity(p.Name, ex, "no host of the pool can hold the guest now (instances do not queue)")
	}
	if err := b.CheckQuota(ctx, charge(&r)); err != nil {
		return nil, nil, err
	}
	evs := []envelope.Event{event("reservation.created", &r, map[string]any{"gpus": r.GPUs, "binding": r.Binding})}
	more, err := e.held(ctx, b, &r, now)
	if err != nil {
		return nil, nil, err
	}
	evs = append(evs, more...)
	if err := stageInsert(ctx, b, &r); err != nil {
		return nil, nil, err
	}
	return &r, evs, nil
}

// pinnedNoCapacity is noCapacity for a guest pinned to a node: it names
// the node and, in the message, only its reason (every other node's is the
// pin, which the explanation still counts for clients that read it).
func pinnedNoCapacity(poolName, node string, ex placement.Explanation) error {
	msg := fmt.Sprintf("no capacity in pool %s: node %s (where the request is pinned) cannot hold the guest now (instances do not queue)", poolName, node)
	if s := placer.PinnedOwn(ex).String(); s != "" {
		msg += " (" + s + ")"
	}
	return &envelope.Error{Code: envelope.CodeNoCapacity, Message: msg, Explanation: placer.ExplanationProto(ex)}
}

func cmpField(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// EndInstance releases an instance's reservation (the guest was deleted,
// failed, or was lost with its host): its bookings end now. Ending one
// that already ended, or is gone, is not an error.
func (e *Engine) EndInstance(ctx context.Context, tx store.Tx, reservationID, reason string, now time.Time) ([]envelope.Event, error) {
	if reservationID == "" {
		return nil, nil
	}
	r, err := getForUpdate(ctx, tx, reservationID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if r.Binding != BindingInstance {
		return nil, fmt.Errorf("reservation %s is not an instance's (binding %s)", r.ID, r.Binding)
	}
	return e.end(ctx, tx, &r, StateReleased, reason, now)
}

// GetInstanceReservation reads an instance's reservation (its placement:
// node, CPUs, NUMA node, GPUs).
func GetInstanceReservation(ctx context.Context, q store.Querier, id string) (Reservation, error) {
	return Get(ctx, q, "", id)
}
