package quota

import (
	"context"
	"errors"
	"math"
	"regexp"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Service serves the QuotaService API.
type Service struct {
	env *envelope.Envelope
}

// NewService returns the quota handlers.
func NewService(env *envelope.Envelope) *Service { return &Service{env: env} }

var _ apiv1connect.QuotaServiceHandler = (*Service)(nil)

// Resource projects a quota into the authorization model: it sits in its
// project, or in the tenant when it is tenant-wide.
func Resource(q Quota) iam.Resource {
	return iam.Resource{Type: "Quota", ID: q.ID, TenantID: q.TenantID, ProjectID: q.ProjectID, Attrs: map[string]any{"scope": q.Kind()}}
}

// Proto converts a quota and its scope's usage for the API.
func Proto(q Quota, u Usage) *apiv1.Quota {
	return &apiv1.Quota{
		Id: q.ID, TenantId: q.TenantID, ProjectId: q.ProjectID, Model: q.Model, PoolId: q.PoolID,
		Gpus: int32(q.GPUs), GpuHours: q.GPUHours, GpusUsed: int32(u.GPUs), GpuHoursUsed: u.GPUHours,
		UpdateTime: timestamppb.New(q.UpdateTime),
	}
}

// Request bounds.
const (
	// MaxGPUHours keeps a limit a number every client prints and parses
	// exactly (about 114 years of 10 million GPUs).
	MaxGPUHours = 1e13
)

var modelRE = regexp.MustCompile(`^[A-Za-z0-9.-]{1,32}$`)

// usageNow is what a quota's scope holds at now: GPUs over the window
// [now, now+1µs), GPU-hours in all.
func usageNow(ctx context.Context, q store.Querier, qt Quota, now time.Time) (Usage, error) {
	return usageOf(ctx, q, qt, now, now.Add(time.Microsecond), "")
}

// setRef is a Set request's references, resolved before the decision.
type setRef struct {
	tenant       tenancy.Tenant
	project      tenancy.Project
	pool         pool.Pool
	tenantFound  bool
	projectFound bool
	poolFound    bool
}

// lookupSet resolves a Set's tenant, project and pool. Misses are not errors
// yet: the decision comes first, so a stranger learns nothing about other
// tenants' projects and pools.
func lookupSet(ctx context.Context, q store.Querier, msg *apiv1.SetQuotaRequest) (setRef, error) {
	var r setRef
	var err error
	if r.tenant, r.tenantFound, err = tenancy.LookupTenant(ctx, q, msg.GetTenant()); err != nil || !r.tenantFound {
		return r, err
	}
	if msg.GetProject() != "" {
		r.project, err = tenancy.ProjectGet(ctx, q, r.tenant.ID, msg.GetProject())
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return r, err
		default:
			r.projectFound = true
		}
	}
	if msg.GetPool() != "" {
		// The tenant's own pool or one offered to it: a quota bounds what
		// a consumer may hold of an owner's pool.
		if r.pool, r.poolFound, _, err = pool.ResolveVisible(ctx, q, r.tenant.ID, msg.GetPool()); err != nil {
			return r, err
		}
	}
	return r, nil
}

// Set creates or replaces the quota of one scope.
func (s *Service) Set(ctx context.Context, req *connect.Request[apiv1.SetQuotaRequest]) (*connect.Response[apiv1.SetQuotaResponse], error) {
	msg := req.Msg
	var r setRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.SetQuotaResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			if msg.GetProject() != "" {
				vs.Ref("project", msg.GetProject(), "prj")
			}
			if m := msg.GetModel(); m != "" && !modelRE.MatchString(m) {
				vs.Add("model", "must match [A-Za-z0-9.-]{1,32}, got %q", truncate(m))
			}
			if msg.GetPool() != "" {
				pool.ValidateVisibleRef(&vs, "pool", msg.GetPool())
			}
			if msg.Gpus != nil && msg.GetGpus() < 0 {
				vs.Add("gpus", "must not be negative (leave it unset for no limit), got %d", msg.GetGpus())
			}
			if h := msg.GetGpuHours(); msg.GpuHours != nil && (math.IsNaN(h) || h < 0 || h > MaxGPUHours) {
				vs.Add("gpu_hours", "must be between 0 and %g (leave it unset for no limit), got %v", float64(MaxGPUHours), h)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupSet(ctx, q, msg)
			// The draft sits where the quota will: in its project, or in
			// the tenant. A project that does not exist leaves it in the
			// tenant, still a project quota, so a tenant admin hears
			// NOT_FOUND rather than a refusal meant for tenant quotas.
			res := iam.Resource{Type: "Quota", ID: iam.DraftID, TenantID: r.tenant.ID, ProjectID: r.project.ID,
				Attrs: map[string]any{"scope": ScopeTenant}}
			if msg.GetProject() != "" {
				res.Attrs["scope"] = ScopeProject
			}
			return res, err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.SetQuotaResponse, error) {
			switch {
			case !r.tenantFound:
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			case msg.GetProject() != "" && !r.projectFound:
				return nil, envelope.NotFound("project", msg.GetProject())
			case msg.GetPool() != "" && !r.poolFound:
				return nil, envelope.NotFound("pool", msg.GetPool())
			}
			// The project or pool may have gone since the draft.
			if r.projectFound {
				if _, err := tenancy.ProjectGet(ctx, tx, r.tenant.ID, r.project.ID); errors.Is(err, store.ErrNotFound) {
					return nil, envelope.NotFound("project", msg.GetProject())
				} else if err != nil {
					return nil, err
				}
			}
			if r.poolFound {
				p, err := pool.Get(ctx, tx, "", r.pool.ID)
				switch {
				case errors.Is(err, store.ErrNotFound):
					return nil, envelope.NotFound("pool", msg.GetPool())
				case err != nil:
					return nil, err
				case p.State != pool.StateActive:
					return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s is %s: it takes no quota", p.Name, p.State)
				}
			}
			now := tx.Now()
			q := Quota{
				ID: envelope.NewID(IDPrefix, now), TenantID: r.tenant.ID, ProjectID: r.project.ID, Model: NormalModel(msg.GetModel()),
				PoolID: r.pool.ID, GPUs: Unlimited, GPUHours: Unlimited, CreatedBy: tx.Caller().Principal.ID, CreateTime: now, UpdateTime: now,
			}
			if msg.Gpus != nil {
				q.GPUs = int(msg.GetGpus())
			}
			if msg.GpuHours != nil {
				q.GPUHours = msg.GetGpuHours()
			}
			if err := Upsert(ctx, tx, &q); err != nil {
				return nil, err
			}
			u, err := usageNow(ctx, tx, q, now)
			if err != nil {
				return nil, err
			}
			tx.SetResource(q.ID, "")
			tx.Emit(envelope.Event{Type: "quota.set", TenantID: q.TenantID, ResourceType: "Quota", ResourceID: q.ID,
				Data: map[string]any{"scope": q.Scope(), "gpus": q.GPUs, "gpu_hours": q.GPUHours}})
			return &apiv1.SetQuotaResponse{Quota: Proto(q, u)}, nil
		},
	})
}

// Get reads a quota with its scope's usage.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetQuotaRequest]) (*connect.Response[apiv1.GetQuotaResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	vs.ID("quota", msg.GetQuota(), IDPrefix)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t              tenancy.Tenant
		q              Quota
		tfound, qfound bool
	)
	if err := s.env.Resolve(ctx, "quota", func(ctx context.Context, db store.Querier) (err error) {
		if t, tfound, err = tenancy.LookupTenant(ctx, db, msg.GetTenant()); err != nil || !tfound {
			return err
		}
		q, err = Get(ctx, db, t.ID, msg.GetQuota())
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		qfound = err == nil
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	// Decide before saying whether anything exists.
	res := iam.Resource{Type: "Quota", ID: "unknown", TenantID: t.ID}
	if qfound {
		res = Resource(q)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	switch {
	case !tfound:
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", msg.GetTenant()))
	case !qfound:
		return nil, s.env.Fail(ctx, envelope.NotFound("quota", msg.GetQuota()))
	}
	var u Usage
	if err := s.env.Resolve(ctx, "quota usage", func(ctx context.Context, db store.Querier) (err error) {
		u, err = usageNow(ctx, db, q, s.env.Clock().Now())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetQuotaResponse{Quota: Proto(q, u)}), nil
}

// List lists quotas with their usage: a tenant's (or one project's), or
// every tenant's for platform admins.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListQuotasRequest]) (*connect.Response[apiv1.ListQuotasResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	if msg.GetTenant() != "" {
		vs.Ref("tenant", msg.GetTenant(), "tnt")
	}
	if msg.GetProject() != "" {
		vs.Ref("project", msg.GetProject(), "prj")
		if msg.GetTenant() == "" {
			vs.Add("tenant", "is required when project is set")
		}
	}
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := msg.GetTenant() + "/" + msg.GetProject()
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t      tenancy.Tenant
		p      tenancy.Project
		tfound = true
		pfound = true
		res    = tenancy.PlatformResource()
	)
	if msg.GetTenant() != "" {
		if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
			if t, tfound, err = tenancy.LookupTenant(ctx, q, msg.GetTenant()); err != nil || !tfound || msg.GetProject() == "" {
				return err
			}
			p, err = tenancy.ProjectGet(ctx, q, t.ID, msg.GetProject())
			if errors.Is(err, store.ErrNotFound) {
				pfound = false
				return nil
			}
			return err
		}); err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		res = tenancy.TenantResource(t)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	switch {
	case !tfound:
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", msg.GetTenant()))
	case !pfound:
		return nil, s.env.Fail(ctx, envelope.NotFound("project", msg.GetProject()))
	}
	// Quotas of a project are decided on the project as well, once each:
	// a policy forbidding a project hides its quotas as it does from Get.
	rf := s.env.NewReadFilter(res)
	if p.ID != "" {
		if err := rf.RequireProject(ctx, t.ID, p.ID); err != nil {
			return nil, err
		}
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var qs []Quota
	if err := s.env.Resolve(ctx, "quotas", func(ctx context.Context, q store.Querier) (err error) {
		qs, err = List(ctx, q, &ListParams{TenantID: t.ID, ProjectID: p.ID, After: after, Limit: limit + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListQuotasResponse{}
	if len(qs) > limit {
		// The cursor follows the rows read, not those shown.
		out.NextPageToken = envelope.EncodePageToken(qs[limit-1].ID, filter)
		qs = qs[:limit]
	}
	qs, err = envelope.KeepReadable(ctx, rf, qs, func(q Quota) (string, string) { return q.TenantID, q.ProjectID })
	if err != nil {
		return nil, err
	}
	now := s.env.Clock().Now()
	if err := s.env.Resolve(ctx, "quotas", func(ctx context.Context, q store.Querier) error {
		for _, qt := range qs {
			u, err := usageNow(ctx, q, qt, now)
			if err != nil {
				return err
			}
			out.Quotas = append(out.Quotas, Proto(qt, u))
		}
		return nil
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(out), nil
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
