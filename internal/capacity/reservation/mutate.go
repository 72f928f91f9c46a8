package reservation

import (
	"context"
	"errors"
	"fmt"
	"time"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"

	"connectrpc.com/connect"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// ref is a reservation reference resolved before a decision.
type ref struct {
	tenant      tenancy.Tenant
	tenantFound bool
	r           Reservation
	found       bool
	poolName    string
}

func lookup(ctx context.Context, q store.Querier, tenantRef, id string) (ref, error) {
	var out ref
	var err error
	if out.tenant, out.tenantFound, err = tenancy.LookupTenant(ctx, q, tenantRef); err != nil || !out.tenantFound {
		return out, err
	}
	r, err := Get(ctx, q, out.tenant.ID, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return out, nil
	case err != nil:
		return out, err
	}
	out.r, out.found = r, true
	if p, err := pool.Get(ctx, q, "", r.PoolID); err == nil {
		out.poolName = p.Name
	}
	return out, nil
}

func (r ref) resource() iam.Resource {
	switch {
	case r.found:
		return Resource(r.r)
	case r.tenantFound:
		return iam.Resource{Type: "Reservation", ID: "unknown", TenantID: r.tenant.ID}
	}
	return tenancy.PlatformResource()
}

func (r ref) notFound(tenantRef, id string) error {
	switch {
	case !r.tenantFound:
		return envelope.NotFound("tenant", tenantRef)
	case !r.found:
		return envelope.NotFound("reservation", id)
	}
	return nil
}

func validateRef(vs *envelope.Violations, tenant, id string) {
	vs.Ref("tenant", tenant, "tnt")
	vs.ID("reservation", id, IDPrefix)
}

// ownerURL returns the API URL of the replica that places the pool poolOf
// names, or "" when this replica does (always, on SQLite) or the pool is not
// found (the mutation then answers for itself).
func (s *Service) ownerURL(ctx context.Context, poolOf func(q store.Querier) (string, error)) (string, error) {
	if s.env.DB().PgxPool() == nil {
		return "", nil
	}
	var poolID string
	if err := s.env.DB().Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		poolID, err = poolOf(tx)
		return err
	}); err != nil && !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	if poolID == "" {
		return "", nil
	}
	_, url, err := s.engine.placers.Claim(ctx, poolID)
	return url, err
}

// refMutation is a mutation of one stored reservation.
type refMutation[Res any] struct {
	tenant, id string
	validate   func(*envelope.Violations)
	// context adds facts to the decision (the lifetime an extension asks).
	context func(r *Reservation) map[string]any
	apply   func(ctx context.Context, tx *envelope.Tx, r *Reservation, poolName string) (*Res, error)
}

func mutateRef[Req, Res any](ctx context.Context, s *Service, req *connect.Request[Req], m refMutation[Res]) (*connect.Response[Res], error) {
	if url, err := s.ownerURL(ctx, func(q store.Querier) (string, error) {
		r, err := lookup(ctx, q, m.tenant, m.id)
		return r.r.PoolID, err
	}); err != nil || url != "" {
		if err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		return placer.Forward[Req, Res](ctx, &s.engine.placers, url, envelope.InfoFrom(ctx).Procedure, req)
	}
	var r ref
	mut := envelope.Mutation[Res]{
		Validate: func() error {
			var vs envelope.Violations
			validateRef(&vs, m.tenant, m.id)
			if m.validate != nil {
				m.validate(&vs)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookup(ctx, q, m.tenant, m.id)
			return r.resource(), err
		},
		// A reservation's transitions go through its pool's placer, so
		// they never race the pool's placements.
		Submit: func(ctx context.Context, write func(ctx context.Context, b *envelope.Batch) error) error {
			if !r.found || r.r.PoolID == "" {
				return s.env.CommitAlone(ctx, write)
			}
			return s.engine.placers.SubmitMutation(ctx, r.r.PoolID, r.r.TenantID, true, write)
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*Res, error) {
			if err := r.notFound(m.tenant, m.id); err != nil {
				return nil, err
			}
			cur, err := getForUpdate(ctx, tx.Tx, r.r.ID)
			if err != nil {
				return nil, err
			}
			return m.apply(ctx, tx, &cur, r.poolName)
		},
	}
	if m.context != nil {
		mut.Context = func() map[string]any {
			if !r.found {
				return nil
			}
			return m.context(&r.r)
		}
	}
	return envelope.Mutate(ctx, s.env, req, mut)
}

// newEnd is the end an extension asks for.
func newEnd(r *Reservation, msg *apiv1.ExtendReservationRequest) time.Time {
	if msg.GetEndTime() != nil {
		return msg.GetEndTime().AsTime().UTC().Truncate(booking.Resolution)
	}
	return r.EndsAt.Add(time.Duration(msg.GetExtendSeconds()) * time.Second)
}

// Extend moves a live reservation's end. IAM decides with the lifetime the
// reservation would then have (context.lifetimeSeconds); the bookings'
// exclusion constraint decides whether the atoms are free for it.
func (s *Service) Extend(ctx context.Context, req *connect.Request[apiv1.ExtendReservationRequest]) (*connect.Response[apiv1.ExtendReservationResponse], error) {
	msg := req.Msg
	var decidedFrom, decidedEnd time.Time
	return mutateRef(ctx, s, req, refMutation[apiv1.ExtendReservationResponse]{
		tenant: msg.GetTenant(), id: msg.GetReservation(),
		validate: func(vs *envelope.Violations) {
			switch {
			case msg.GetEndTime() != nil && msg.GetExtendSeconds() != 0:
				vs.Add("end_time", "give end_time or extend_seconds, not both")
			case msg.GetEndTime() != nil:
				if msg.GetEndTime().CheckValid() != nil {
					vs.Add("end_time", "is not a valid time")
				}
			case msg.GetExtendSeconds() <= 0:
				vs.Add("extend_seconds", "must be positive, got %d", msg.GetExtendSeconds())
			case msg.GetExtendSeconds() > pool.MaxDurationSeconds:
				vs.Add("extend_seconds", "at most %d (30 days)", pool.MaxDurationSeconds)
			}
		},
		context: func(r *Reservation) map[string]any {
			// The end decided on is the end applied: an absolute time,
			// fixed here from the row the decision saw.
			decidedFrom, decidedEnd = r.EndsAt, newEnd(r, msg)
			return map[string]any{"lifetimeSeconds": int64(decidedEnd.Sub(r.StartsAt) / time.Second)}
		},
		apply: func(ctx context.Context, tx *envelope.Tx, r *Reservation, poolName string) (*apiv1.ExtendReservationResponse, error) {
			if !capmodel.Live(r.State) || r.State == StateReleasing {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "reservation %s is %s; only a live reservation can be extended", r.ID, r.State)
			}
			if !r.EndsAt.Equal(decidedFrom) {
				// Another change moved the end since the decision: the
				// lifetime allowed is not the one this would commit.
				return nil, envelope.Errorf(envelope.CodeConflict, "reservation %s changed since this extension was authorized (its end is now %s); retry",
					r.ID, r.EndsAt.Format(time.RFC3339))
			}
			end := decidedEnd
			if !end.After(r.EndsAt) {
				return nil, envelope.Invalid(envelope.Violation{Field: "end_time", Reason: fmt.Sprintf("must be after the current end %s", r.EndsAt.Format(time.RFC3339))})
			}
			p, err := pool.Get(ctx, tx, "", r.PoolID)
			if err != nil {
				return nil, err
			}
			if maxD := time.Duration(poolPolicy(p).GetMaxDurationSeconds()) * time.Second; maxD > 0 && end.Sub(r.StartsAt) > maxD {
				return nil, envelope.Invalid(envelope.Violation{Field: "end_time", Reason: fmt.Sprintf("pool %s books at most %s", p.Name, maxD)})
			}
			if end.Sub(r.StartsAt) > pool.MaxDurationSeconds*time.Second {
				return nil, envelope.Invalid(envelope.Violation{Field: "end_time", Reason: "a reservation lasts at most 30 days"})
			}
			from := r.State
			r.EndsAt = end
			b := placer.BatchOf(ctx)
			if b == nil {
				b = placer.Immediate(tx.Tx, tx.Now())
				b.EmitTo(tx.Emit)
			}
			// The batch's check, as for a create: it counts what the
			// batch's earlier items charged and holds the tenant's quota
			// rows until the commit.
			if err := b.CheckQuota(ctx, charge(r)); err != nil {
				return nil, err
			}
			if capmodel.Holding(from) {
				if err := b.ExtendHost(ctx, r); err != nil {
					if placer.IsHostFull(err) {
						return nil, envelope.Errorf(envelope.CodeConflict, "reservation %s cannot be extended to %s: its node's host memory, hugepages or single tenancy are booked by another reservation by then",
							r.ID, end.Format(time.RFC3339))
					}
					return nil, err
				}
			}
			if capmodel.Holding(from) {
				if err := booking.Extend(ctx, tx.Tx, r.ID, end); err != nil {
					if errors.Is(err, booking.ErrOverlap) {
						return nil, envelope.Errorf(envelope.CodeConflict, "reservation %s cannot be extended to %s: another reservation books its devices by then", r.ID, end.Format(time.RFC3339))
					}
					return nil, err
				}
			}
			if capmodel.Holding(from) && b.Index() != nil {
				// Marked now, so the batch's later placements see it;
				// undone if the item or the batch rolls back.
				ix, nodeID, id, prevEnd := b.Index(), r.NodeID, r.ID, decidedFrom
				ix.Extended(nodeID, id, end, tx.Now())
				b.OnUndo(func() { ix.Shortened(nodeID, id, prevEnd, b.Now()) })
			}
			r.UpdateTime = tx.Now()
			ok, err := save(ctx, tx.Tx, r, from)
			if err != nil || !ok {
				return nil, errors.Join(err, errMoved(ok))
			}
			tx.Emit(event("reservation.extended", r, map[string]any{"end_time": end.Format(time.RFC3339Nano)}))
			return &apiv1.ExtendReservationResponse{Reservation: Proto(*r, poolName)}, nil
		},
	})
}

// Release ends a reservation now. A reservation that already ended is
// returned as it is: releasing twice is not an error. A kubernetes binding
// the node holds becomes releasing: its bookings end when the node reports
// that its pods let go (held.go).
func (s *Service) Release(ctx context.Context, req *connect.Request[apiv1.ReleaseReservationRequest]) (*connect.Response[apiv1.ReleaseReservationResponse], error) {
	msg := req.Msg
	return mutateRef(ctx, s, req, refMutation[apiv1.ReleaseReservationResponse]{
		tenant: msg.GetTenant(), id: msg.GetReservation(),
		apply: func(ctx context.Context, tx *envelope.Tx, r *Reservation, poolName string) (*apiv1.ReleaseReservationResponse, error) {
			evs, err := s.engine.end(ctx, tx.Tx, r, StateReleased, "Released", tx.Now())
			if err != nil {
				return nil, err
			}
			for _, ev := range evs {
				tx.Emit(ev)
			}
			return &apiv1.ReleaseReservationResponse{Reservation: Proto(*r, poolName)}, nil
		},
	})
}

// Cancel withdraws a reservation that is not active yet; an active one is
// released instead. Canceling twice is not an error.
func (s *Service) Cancel(ctx context.Context, req *connect.Request[apiv1.CancelReservationRequest]) (*connect.Response[apiv1.CancelReservationResponse], error) {
	msg := req.Msg
	return mutateRef(ctx, s, req, refMutation[apiv1.CancelReservationResponse]{
		tenant: msg.GetTenant(), id: msg.GetReservation(),
		apply: func(ctx context.Context, tx *envelope.Tx, r *Reservation, poolName string) (*apiv1.CancelReservationResponse, error) {
			if r.State == StateActive {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "reservation %s is active: release it instead", r.ID)
			}
			evs, err := s.engine.end(ctx, tx.Tx, r, StateCanceled, "Canceled", tx.Now())
			if err != nil {
				return nil, err
			}
			for _, ev := range evs {
				tx.Emit(ev)
			}
			return &apiv1.CancelReservationResponse{Reservation: Proto(*r, poolName)}, nil
		},
	})
}
