package reservation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// An array is count identical reservations asked for in one request
// (CreateReservations). It goes through the envelope as one mutation: one
// decision (reservations.create, on the draft reservation with totalGpus =
// count × gpus, and context.count), one placer work item, one transaction,
// and so one audit row, whose detail names the array's ids — the audit log
// records requests and their decisions, and this was one request decided
// once; each reservation still has its own reservation.created event.
//
// An array is placed now or refused; it never queues. Members are placed
// one after another in the placer's batch (each sees the bookings of the
// ones before it) and each is charged against quota with the charges
// staged before it, so the quota check covers the array as a whole. The
// first member that cannot be placed now or would exceed a quota ends the
// array: with min_count 0 nothing is booked and the answer is the refusal
// that member met (NO_CAPACITY, or QUOTA_EXCEEDED); with min_count > 0 the
// members placed so far are booked if there are at least min_count of them,
// and the answer says why the rest were not. Members are identical, so one
// that does not fit means no later one would.

// MaxArray is the most reservations one CreateReservations books.
const MaxArray = 1000

// notNow: an array's member found no room now (it could fit later, but an
// array does not wait).
type notNow struct{ ex placement.Explanation }

func (e *notNow) Error() string { return "does not fit now" }

// validateArray checks an array request; the template is checked exactly as
// Create checks its request, its fields named under template.
func validateArray(vs *envelope.Violations, msg *apiv1.CreateReservationsRequest, now time.Time) spec {
	count, minCount := msg.GetCount(), msg.GetMinCount()
	switch {
	case count < 1:
		vs.Add("count", "ask for at least 1 reservation, got %d", count)
	case count > MaxArray:
		vs.Add("count", "at most %d, got %d", MaxArray, count)
	}
	switch {
	case minCount < 0:
		vs.Add("min_count", "must not be negative, got %d", minCount)
	case count >= 1 && minCount > count:
		vs.Add("min_count", "at most count (%d), got %d", count, minCount)
	}
	if g := msg.GetGang(); g != nil {
		if count > placer.MaxGangNodes {
			vs.Add("count", "a gang spans at most %d nodes, got %d", placer.MaxGangNodes, count)
		}
		if minCount != 0 {
			vs.Add("min_count", "a gang is all placed or none: leave it 0, got %d", minCount)
		}
		if topo := g.GetTopology(); topo != "" && !slices.Contains(placer.Topologies, topo) {
			vs.Add("gang.topology", "one of %s, or empty for any nodes; got %q", strings.Join(placer.Topologies, ", "), topo)
		}
		if tm := msg.GetTemplate(); tm != nil && (tm.GetGpus() < 1 || tm.GetMigProfile() != "" || tm.GetSlots() != 0) {
			vs.Add("template.gpus", "a gang's members take whole GPUs: set gpus (per node), not mig_profile or slots")
		}
	}
	if msg.GetTemplate() == nil {
		vs.Add("template", "is required")
		return spec{msg: &apiv1.CreateReservationRequest{}, now: now}
	}
	var tvs envelope.Violations
	sp := validateCreate(&tvs, msg.GetTemplate(), now)
	for _, v := range tvs {
		*vs = append(*vs, envelope.Violation{Field: "template." + v.Field, Reason: v.Reason})
	}
	return sp
}

// CreateReservations books an array of identical reservations: all count
// placed now, or at least min_count when it is set, or none. See the top of
// this file for what it decides, writes and audits.
func (s *Service) CreateReservations(ctx context.Context, req *connect.Request[apiv1.CreateReservationsRequest]) (*connect.Response[apiv1.CreateReservationsResponse], error) {
	if tmpl := req.Msg.GetTemplate(); tmpl != nil {
		if url, err := s.ownerURL(ctx, poolNamed(ctx, tmpl)); err != nil || url != "" {
			if err != nil {
				return nil, s.env.Fail(ctx, err)
			}
			return placer.Forward[apiv1.CreateReservationsRequest, apiv1.CreateReservationsResponse](ctx, &s.engine.placers, url, apiv1connect.ReservationServiceCreateReservationsProcedure, req)
		}
	}
	var sp spec
	var t target
	count, minCount := int(req.Msg.GetCount()), int(req.Msg.GetMinCount())
	gang := req.Msg.GetGang()
	now := s.env.Clock().Now()
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateReservationsResponse]{
		Validate: func() error {
			var vs envelope.Violations
			sp = validateArray(&vs, req.Msg, now)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, err = s.resolve(ctx, q, &sp)
			return draftResource(&t, &sp, count), err
		},
		Context: func() map[string]any {
			c := map[string]any{"count": int64(count)}
			if gang != nil {
				c["gang"] = true
			}
			return c
		},
		Submit: func(ctx context.Context, write func(ctx context.Context, b *envelope.Batch) error) error {
			if !t.poolFound {
				return s.env.CommitAlone(ctx, write)
			}
			// One work item: the whole array is placed and written in one
			// batch of the pool's placer, or not at all.
			return s.engine.placers.SubmitMutation(ctx, t.pool.ID, t.tenant.ID, false, write)
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateReservationsResponse, error) {
			b := placer.BatchOf(ctx)
			if b != nil {
				p, err := b.LockPool(ctx, t.pool.ID)
				if err != nil {
					return nil, envelope.FromStore(err, "pool")
				}
				t.pool, t.policy, t.ix = *p, poolPolicy(*p), b.Index()
			}
			if err := t.check(&sp); err != nil {
				return nil, prefixed(err, "template.")
			}
			var rs []Reservation
			var evs []envelope.Event
			var shortfall, domain string
			var err error
			if gang != nil {
				rs, evs, domain, err = s.engine.createGang(ctx, b, &t, &sp, count, gang.GetTopology(), tx.Now(), tx.Caller().Principal.ID)
			} else {
				rs, evs, shortfall, err = s.engine.createArray(ctx, b, &t, &sp, count, minCount, tx.Now(), tx.Caller().Principal.ID)
			}
			if err != nil {
				return nil, prefixed(err, "template.")
			}
			ids := make([]string, len(rs))
			out := &apiv1.CreateReservationsResponse{Shortfall: shortfall}
			for i, r := range rs {
				ids[i] = r.ID
				p := Proto(r, t.pool.Name)
				p.Tenant = t.tenant.Name
				out.Reservations = append(out.Reservations, p)
			}
			// One audit row for the one request: its resource is the first
			// reservation, its detail names them all.
			tx.SetResource(ids[0], "")
			if gang != nil {
				out.GangDomain = domain
				tx.SetAuditDetail(fmt.Sprintf("gang of %d nodes in %s: %s", len(ids), gangWhere(gang.GetTopology(), domain), strings.Join(ids, " ")))
			} else {
				tx.SetAuditDetail(fmt.Sprintf("array of %d (asked %d): %s", len(ids), count, strings.Join(ids, " ")))
			}
			for _, ev := range evs {
				tx.Emit(ev)
			}
			return out, nil
		},
	})
}

// createArray places count members of an array in the batch, one after
// another. The first that cannot be placed now (or whose quota charge,
// counted with the members' before it, would exceed a quota) ends it: the
// array fails with that member's refusal unless minCount > 0 and at least
// minCount are placed, and then answers those with why it stopped.
func (e *Engine) createArray(ctx context.Context, b *placer.Batch, t *target, sp *spec, count, minCount int, now time.Time, createdBy string) ([]Reservation, []envelope.Event, string, error) {
	need := count
	if minCount > 0 {
		need = minCount
	}
	rs := make([]Reservation, 0, count)
	var evs []envelope.Event
	for len(rs) < count {
		r := t.newReservation(sp, now, createdBy)
		m := b.Mark()
		var more []envelope.Event
		// A member refused after it booked (its quota charge) must leave
		// no booking behind when the array goes on without it.
		err := b.Atomic(ctx, "member", func() (err error) {
			more, err = e.create(ctx, b, &r, t, now, false)
			return err
		})
		if err == nil {
			rs = append(rs, r)
			evs = append(evs, more...)
			continue
		}
		// Nothing of the member that failed stays staged.
		b.Rewind(m)
		var nn *notNow
		var apiErr *envelope.Error
		short := errors.As(err, &nn) ||
			(errors.As(err, &apiErr) && (apiErr.Code == envelope.CodeNoCapacity || apiErr.Code == envelope.CodeQuotaExceeded))
		if !short {
			return nil, nil, "", err
		}
		if len(rs) >= need && len(rs) > 0 {
			why := "no room now"
			if nn == nil {
				why = apiErr.Message
			}
			return rs, evs, fmt.Sprintf("%d of %d booked: %s", len(rs), count, why), nil
		}
		if nn != nil {
			why := fmt.Sprintf("%d of the array's %d fit now, and an array is placed now or refused, never queued", len(rs), count)
			if minCount > 0 {
				why = fmt.Sprintf("%d of the array's %d fit now, fewer than min_count %d; an array is never queued", len(rs), count, minCount)
			}
			return nil, nil, "", noCapacity(t.pool.Name, nn.ex, why)
		}
		return nil, nil, "", err
	}
	return rs, evs, "", nil
}

// gangWhere names a gang's domain for people: "rack r12", or "the pool".
func gangWhere(topology, domain string) string {
	if topology == "" {
		return "the pool"
	}
	return topology + " " + domain
}

// createGang places count members on count different nodes of one domain
// of topology, all or none, and never queues: a gang that does not fit
// now is refused with why (the largest domain's room). A member that
// could never fit the pool is the caller's mistake, as for Create.
func (e *Engine) createGang(ctx context.Context, b *placer.Batch, t *target, sp *spec, count int, topology string, now time.Time, createdBy string) ([]Reservation, []envelope.Event, string, error) {
	rs := make([]Reservation, count)
	ptrs := make([]*Reservation, count)
	for i := range rs {
		rs[i] = t.newReservation(sp, now, createdBy)
		ptrs[i] = &rs[i]
	}
	domain, why, ex, err := e.placers.PlaceGang(ctx, b, ptrs, topology, now)
	if err != nil {
		var re *placement.RequestError
		if errors.As(err, &re) {
			return nil, nil, "", envelope.Invalid(envelope.Violation{Field: re.Field, Reason: re.Reason})
		}
		return nil, nil, "", err
	}
	if why != "" {
		if err := e.neverFits(t, &rs[0]); err != nil {
			return nil, nil, "", err
		}
		return nil, nil, "", noCapacity(t.pool.Name, ex, why+"; a gang is placed now or refused, never queued")
	}
	var evs []envelope.Event
	for i := range rs {
		r := &rs[i]
		if err := b.CheckQuota(ctx, charge(r)); err != nil {
			return nil, nil, "", err
		}
		evs = append(evs, event("reservation.created", r, map[string]any{"gpus": r.GPUs, "slots": r.Slots, "gang": rs[0].ID, "gang_size": count, "gang_domain": domain}))
		more, err := e.held(ctx, b, r, now)
		if err != nil {
			return nil, nil, "", err
		}
		evs = append(evs, more...)
		if err := stageInsert(ctx, b, r); err != nil {
			return nil, nil, "", err
		}
	}
	return rs, evs, domain, nil
}
