package budget

import (
	"context"
	"errors"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Service serves the BudgetService API.
type Service struct {
	env *envelope.Envelope
}

// NewService returns the budget handlers.
func NewService(env *envelope.Envelope) *Service { return &Service{env: env} }

var _ apiv1connect.BudgetServiceHandler = (*Service)(nil)

// Resource projects a budget into the authorization model: it sits in its
// tenant.
func Resource(b Budget) iam.Resource {
	return iam.Resource{Type: "Budget", ID: b.ID, TenantID: b.TenantID}
}

// Proto converts a budget and what is committed in its current period.
func Proto(b Budget, start, end time.Time, committed Micros) *apiv1.Budget {
	th := make([]int32, len(b.Thresholds))
	for i, t := range b.Thresholds {
		th[i] = int32(t)
	}
	return &apiv1.Budget{
		Id: b.ID, TenantId: b.TenantID, Period: b.Period, Amount: FormatAmount(b.Amount), Enforcement: b.Enforcement,
		Thresholds: th, PeriodStart: timestamppb.New(start), PeriodEnd: timestamppb.New(end), Committed: FormatAmount(committed),
		UpdateTime: timestamppb.New(b.UpdateTime),
	}
}

// MaxThreshold bounds an alert threshold: ten times the amount, for a soft
// budget watched past its limit.
const MaxThreshold = 1000

func (s *Service) proto(ctx context.Context, q store.Querier, b Budget) (*apiv1.Budget, error) {
	start, end, c, err := Committed(ctx, q, b, s.env.Clock().Now())
	if err != nil {
		return nil, err
	}
	return Proto(b, start, end, c), nil
}

// validateSet checks a Set request, naming each offending field.
func validateSet(msg *apiv1.SetBudgetRequest) (Micros, []int, error) {
	var vs envelope.Violations
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	switch msg.GetPeriod() {
	case PeriodMonth, PeriodWeek, PeriodDay:
	default:
		vs.Add("period", "must be month, week or day, got %q", trunc(msg.GetPeriod()))
	}
	amount, err := ParseAmount(msg.GetAmount())
	switch {
	case err != nil:
		vs.Add("amount", "%s", err.Error())
	case amount <= 0:
		vs.Add("amount", "must be more than 0, got %q", msg.GetAmount())
	}
	switch msg.GetEnforcement() {
	case "", Hard, Soft:
	default:
		vs.Add("enforcement", "must be hard or soft, got %q", trunc(msg.GetEnforcement()))
	}
	var th []int
	for _, t := range msg.GetThresholds() {
		switch {
		case t < 1 || t > MaxThreshold:
			vs.Add("thresholds", "each must be between 1 and %d percent, got %d", MaxThreshold, t)
		case slices.Contains(th, int(t)):
			vs.Add("thresholds", "lists %d twice", t)
		default:
			th = append(th, int(t))
		}
	}
	if len(msg.GetThresholds()) > 10 {
		vs.Add("thresholds", "at most 10, got %d", len(msg.GetThresholds()))
	}
	if len(th) == 0 {
		th = slices.Clone(DefaultThresholds)
	}
	slices.Sort(th)
	return amount, th, vs.Err()
}

// Set creates or replaces a tenant's budget.
func (s *Service) Set(ctx context.Context, req *connect.Request[apiv1.SetBudgetRequest]) (*connect.Response[apiv1.SetBudgetResponse], error) {
	msg := req.Msg
	var (
		t      tenancy.Tenant
		found  bool
		amount Micros
		th     []int
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.SetBudgetResponse]{
		Validate: func() (err error) {
			amount, th, err = validateSet(msg)
			return err
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, found, err = tenancy.LookupTenant(ctx, q, msg.GetTenant())
			return iam.Resource{Type: "Budget", ID: iam.DraftID, TenantID: t.ID}, err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.SetBudgetResponse, error) {
			if !found {
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			}
			now := tx.Now()
			b := Budget{ID: envelope.NewID(IDPrefix, now), TenantID: t.ID, Period: msg.GetPeriod(), Amount: amount,
				Enforcement: msg.GetEnforcement(), Thresholds: th, CreatedBy: tx.Caller().Principal.ID, CreateTime: now, UpdateTime: now}
			if b.Enforcement == "" {
				b.Enforcement = Hard
			}
			if err := Upsert(ctx, tx, &b); err != nil {
				return nil, err
			}
			if err := Rearm(ctx, tx, b.ID); err != nil {
				return nil, err
			}
			pb, err := s.proto(ctx, tx, b)
			if err != nil {
				return nil, err
			}
			tx.SetResource(b.ID, "")
			tx.Emit(envelope.Event{Type: "budget.set", TenantID: b.TenantID, ResourceType: "Budget", ResourceID: b.ID,
				Data: map[string]any{"period": b.Period, "amount": FormatAmount(b.Amount), "enforcement": b.Enforcement, "thresholds": b.Thresholds}})
			return &apiv1.SetBudgetResponse{Budget: pb}, nil
		},
	})
}

// Delete removes a tenant's budget: its bookings are bounded by nothing
// but quotas again.
func (s *Service) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteBudgetRequest]) (*connect.Response[apiv1.DeleteBudgetResponse], error) {
	msg := req.Msg
	var (
		t      tenancy.Tenant
		b      Budget
		tfound bool
		bfound bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteBudgetResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if t, tfound, err = tenancy.LookupTenant(ctx, q, msg.GetTenant()); err != nil || !tfound {
				return iam.Resource{Type: "Budget", ID: "unknown", TenantID: t.ID}, err
			}
			b, err = Get(ctx, q, t.ID)
			switch {
			case errors.Is(err, store.ErrNotFound):
				return iam.Resource{Type: "Budget", ID: "unknown", TenantID: t.ID}, nil
			case err != nil:
				return iam.Resource{}, err
			}
			bfound = true
			return Resource(b), nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteBudgetResponse, error) {
			switch {
			case !tfound:
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			case !bfound:
				return nil, envelope.NotFound("budget", msg.GetTenant())
			}
			gone, ok, err := Delete(ctx, tx, t.ID)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.NotFound("budget", msg.GetTenant())
			}
			tx.SetResource(gone.ID, "")
			tx.Emit(envelope.Event{Type: "budget.deleted", TenantID: gone.TenantID, ResourceType: "Budget", ResourceID: gone.ID})
			return &apiv1.DeleteBudgetResponse{}, nil
		},
	})
}

// Get reads a tenant's budget with what is committed in its current
// period.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetBudgetRequest]) (*connect.Response[apiv1.GetBudgetResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t              tenancy.Tenant
		b              Budget
		tfound, bfound bool
	)
	if err := s.env.Resolve(ctx, "budget", func(ctx context.Context, db store.Querier) (err error) {
		if t, tfound, err = tenancy.LookupTenant(ctx, db, msg.GetTenant()); err != nil || !tfound {
			return err
		}
		b, err = Get(ctx, db, t.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		bfound = err == nil
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	// Decide before saying whether anything exists.
	res := iam.Resource{Type: "Budget", ID: "unknown", TenantID: t.ID}
	if bfound {
		res = Resource(b)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	switch {
	case !tfound:
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", msg.GetTenant()))
	case !bfound:
		return nil, s.env.Fail(ctx, envelope.NotFound("budget", msg.GetTenant()))
	}
	var out *apiv1.Budget
	if err := s.env.Resolve(ctx, "budget committed", func(ctx context.Context, db store.Querier) (err error) {
		out, err = s.proto(ctx, db, b)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetBudgetResponse{Budget: out}), nil
}

// List lists budgets with what is committed: a tenant's, or every
// tenant's for platform admins.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListBudgetsRequest]) (*connect.Response[apiv1.ListBudgetsResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	if msg.GetTenant() != "" {
		vs.Ref("tenant", msg.GetTenant(), "tnt")
	}
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := msg.GetTenant()
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t      tenancy.Tenant
		tfound = true
		res    = tenancy.PlatformResource()
	)
	if msg.GetTenant() != "" {
		if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
			t, tfound, err = tenancy.LookupTenant(ctx, q, msg.GetTenant())
			return err
		}); err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		res = tenancy.TenantResource(t)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	if !tfound {
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", msg.GetTenant()))
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var bs []Budget
	if err := s.env.Resolve(ctx, "budgets", func(ctx context.Context, q store.Querier) (err error) {
		bs, err = List(ctx, q, &ListParams{TenantID: t.ID, After: after, Limit: limit + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListBudgetsResponse{}
	if len(bs) > limit {
		out.NextPageToken = envelope.EncodePageToken(bs[limit-1].ID, filter)
		bs = bs[:limit]
	}
	if err := s.env.Resolve(ctx, "budgets committed", func(ctx context.Context, q store.Querier) error {
		for _, b := range bs {
			pb, err := s.proto(ctx, q, b)
			if err != nil {
				return err
			}
			out.Budgets = append(out.Budgets, pb)
		}
		return nil
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(out), nil
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
