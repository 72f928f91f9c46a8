package pool

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// MaxOfferTenants bounds a list offer.
const MaxOfferTenants = 1000

// A consumer names an offered pool by its name, its id, or owner/name when
// several owners offer it one name.

// ValidateVisibleRef checks a reference to a pool a tenant may reserve
// from: a name, an id, or owner/name.
func ValidateVisibleRef(vs *envelope.Violations, field, ref string) {
	if owner, name, ok := strings.Cut(ref, "/"); ok {
		vs.Ref(field+" (owner)", owner, "tnt")
		vs.Ref(field, name, IDPrefix)
		return
	}
	vs.Ref(field, ref, IDPrefix)
}

// Ambiguous is a pool name that several owners offer a tenant. Callers
// report it after their decision, like NOT_FOUND: it names the owners.
type Ambiguous struct{ Name, Owner1, Owner2 string }

func (a *Ambiguous) Error() string {
	return "pool " + a.Name + " is offered by several tenants (" + a.Owner1 + ", " + a.Owner2 + "): name it owner/" + a.Name
}

// Err is the error a caller answers with.
func (a *Ambiguous) Err() error {
	return envelope.Invalid(envelope.Violation{Field: "pool", Reason: a.Error()})
}

// ResolveVisible finds the pool ref names among those tenantID owns or is
// offered. found is false when there is none, so the caller answers
// NOT_FOUND after its decision: a pool not offered to the tenant is
// indistinguishable from one that does not exist. A name offered by several
// owners (and not the tenant's own) is not found either, with amb saying
// why, for the caller to report after its decision.
func ResolveVisible(ctx context.Context, q store.Querier, tenantID, ref string) (p Pool, found bool, amb *Ambiguous, err error) {
	ownerID := ""
	if owner, name, ok := strings.Cut(ref, "/"); ok {
		t, ok, err := tenancy.LookupTenant(ctx, q, owner)
		if err != nil || !ok {
			return Pool{}, false, nil, err
		}
		ownerID, ref = t.ID, name
	}
	ps, err := Visible(ctx, q, tenantID, ownerID, ref)
	switch {
	case err != nil:
		return Pool{}, false, nil, err
	case len(ps) == 0:
		return Pool{}, false, nil, nil
	case len(ps) > 1 && ps[0].TenantID != tenantID:
		return Pool{}, false, &Ambiguous{Name: ref, Owner1: ps[0].Owner, Owner2: ps[1].Owner}, nil
	}
	return ps[0], true, nil, nil
}

// withOffers fills the consumer tenants of list offers.
func withOffers(ctx context.Context, q store.Querier, ps []Pool) error {
	for i := range ps {
		if ps[i].Offer != OfferTenants {
			continue
		}
		ts, err := OfferedTenants(ctx, q, ps[i].ID)
		if err != nil {
			return err
		}
		ps[i].OfferedTo = ts
	}
	return nil
}

// offerTarget is an offer request resolved before the decision.
type offerTarget struct {
	poolRef
	scope     string
	consumers []tenancy.Tenant
	missing   []string
}

// Offer replaces who may reserve from a pool besides its owner.
func (s *Service) Offer(ctx context.Context, req *connect.Request[apiv1.OfferPoolRequest]) (*connect.Response[apiv1.OfferPoolResponse], error) {
	msg := req.Msg
	var t offerTarget
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.OfferPoolResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateRef(&vs, msg.GetTenant(), msg.GetPool())
			to := msg.GetTo()
			switch {
			case len(to) > MaxOfferTenants:
				vs.Add("to", "names at most %d tenants, got %d", MaxOfferTenants, len(to))
			case slices.Contains(to, OfferAll) && len(to) > 1:
				vs.Add("to", `"all" stands alone: it offers the pool to every tenant`)
			case len(to) == 1 && to[0] == OfferAll:
			default:
				for i, ref := range to {
					vs.Ref("to["+strconv.Itoa(i)+"]", ref, "tnt")
				}
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if t.poolRef, err = lookup(ctx, q, msg.GetTenant(), msg.GetPool()); err != nil {
				return t.resource(), err
			}
			switch to := msg.GetTo(); {
			case len(to) == 0:
				t.scope = OfferPrivate
			case to[0] == OfferAll:
				t.scope = OfferAll
			default:
				t.scope = OfferTenants
				for _, ref := range to {
					c, ok, err := tenancy.LookupTenant(ctx, q, ref)
					if err != nil {
						return t.resource(), err
					}
					if !ok {
						t.missing = append(t.missing, ref)
						continue
					}
					if c.ID != t.tenant.ID && !slices.ContainsFunc(t.consumers, func(x tenancy.Tenant) bool { return x.ID == c.ID }) {
						t.consumers = append(t.consumers, c)
					}
				}
			}
			res := t.resource()
			res.Attrs = mergeAttrs(res.Attrs, map[string]any{"offer": t.scope})
			return res, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.OfferPoolResponse, error) {
			if err := t.notFound(); err != nil {
				return nil, err
			}
			if len(t.missing) > 0 {
				return nil, envelope.NotFound("tenant", t.missing[0])
			}
			if t.scope == OfferTenants && len(t.consumers) == 0 {
				return nil, envelope.Invalid(envelope.Violation{Field: "to", Reason: "names only the owner: leave it empty to make the pool private"})
			}
			cur, err := Get(ctx, tx, t.pool.TenantID, t.pool.ID)
			if err != nil {
				return nil, err
			}
			pol := normalPolicy(Proto(cur).GetPolicy())
			pol.SingleTenant = msg.GetSingleTenant()
			polJSON, err := policyJSON(pol)
			if err != nil {
				return nil, err
			}
			if ok, err := Update(ctx, tx, cur.TenantID, cur.ID, cur.Selector, polJSON); err != nil || !ok {
				if err == nil {
					err = envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s is %s: it cannot be offered", cur.Name, cur.State)
				}
				return nil, err
			}
			ids := make([]string, 0, len(t.consumers))
			names := make([]string, 0, len(t.consumers))
			for _, c := range t.consumers {
				ids, names = append(ids, c.ID), append(names, c.Name)
			}
			if _, err := SetOffer(ctx, tx, cur.ID, t.scope, ids); err != nil {
				return nil, err
			}
			if cur, err = Get(ctx, tx, cur.TenantID, cur.ID); err != nil {
				return nil, err
			}
			ps := []Pool{cur}
			if err := withOffers(ctx, tx, ps); err != nil {
				return nil, err
			}
			// The policy changed (single_tenant): membership and the
			// placer's index follow it.
			if err := s.notify(ctx, tx, cur.TenantID, cur.ID); err != nil {
				return nil, err
			}
			slices.Sort(names)
			tx.Emit(envelope.Event{Type: "pool.offered", TenantID: cur.TenantID, ResourceType: "Pool", ResourceID: cur.ID,
				Data: map[string]any{"name": cur.Name, "offer": t.scope, "tenants": names, "singleTenant": msg.GetSingleTenant()}})
			return &apiv1.OfferPoolResponse{Pool: Proto(ps[0])}, nil
		},
	})
}

func mergeAttrs(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a)+len(b))
	maps.Copy(out, a)
	maps.Copy(out, b)
	return out
}
