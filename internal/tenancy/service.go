package tenancy

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// TenantService serves the TenantService API.
type TenantService struct {
	env      *envelope.Envelope
	cleaners []Cleaner
}

// ProjectService serves the ProjectService API.
type ProjectService struct {
	env *envelope.Envelope
}

// NewTenantService returns the tenant handlers.
func NewTenantService(env *envelope.Envelope) *TenantService { return &TenantService{env: env} }

// NewProjectService returns the project handlers.
func NewProjectService(env *envelope.Envelope) *ProjectService { return &ProjectService{env: env} }

var (
	_ apiv1connect.TenantServiceHandler  = (*TenantService)(nil)
	_ apiv1connect.ProjectServiceHandler = (*ProjectService)(nil)
)

// TenantResource projects a tenant into the authorization model.
// A zero Tenant (one that does not exist) projects as a platform-level
// resource.
func TenantResource(t Tenant) iam.Resource {
	if t.ID == "" {
		return iam.Resource{Type: "Tenant", ID: "unknown"}
	}
	return iam.Resource{Type: "Tenant", ID: t.ID, TenantID: t.ID, Attrs: map[string]any{"name": t.Name}}
}

// PlatformResource is the container of platform-level actions.
func PlatformResource() iam.Resource { return iam.Resource{Type: "Platform", ID: "platform"} }

// ResolveTenant looks a tenant up by name or id for a handler, mapping a
// miss to NOT_FOUND with the reference the caller gave.
func ResolveTenant(ctx context.Context, q store.Querier, ref string) (Tenant, error) {
	t, err := TenantGet(ctx, q, ref)
	if errors.Is(err, store.ErrNotFound) {
		return Tenant{}, envelope.NotFound("tenant", ref)
	}
	return t, err
}

// LookupTenant is ResolveTenant for drafts: a missing tenant is not an error
// yet. The draft is then decided as a platform-level resource, so a tenant
// principal is refused (PERMISSION_DENIED) without learning whether the
// tenant exists, and only a platform principal goes on to hear NOT_FOUND.
func LookupTenant(ctx context.Context, q store.Querier, ref string) (Tenant, bool, error) {
	t, err := TenantGet(ctx, q, ref)
	if errors.Is(err, store.ErrNotFound) {
		return Tenant{}, false, nil
	}
	return t, err == nil, err
}

// Create creates a tenant.
func (s *TenantService) Create(ctx context.Context, req *connect.Request[apiv1.CreateTenantRequest]) (*connect.Response[apiv1.CreateTenantResponse], error) {
	msg := req.Msg
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateTenantResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Name("name", msg.GetName())
			vs.MaxLen("display_name", msg.GetDisplayName(), 200)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			return iam.Resource{Type: "Tenant", ID: "draft", Attrs: map[string]any{"name": msg.GetName()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateTenantResponse, error) {
			t := Tenant{ID: envelope.NewID("tnt", tx.Now()), Name: msg.GetName(), DisplayName: msg.GetDisplayName(), State: TenantActive, CreateTime: tx.Now()}
			if t.DisplayName == "" {
				t.DisplayName = t.Name
			}
			if err := TenantInsert(ctx, tx, t); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "tenant %q already exists", t.Name)
				}
				return nil, err
			}
			tx.SetResource(t.ID, t.ID)
			tx.Emit(envelope.Event{Type: "tenant.created", TenantID: t.ID, ResourceType: "Tenant", ResourceID: t.ID, Data: map[string]any{"name": t.Name}})
			return &apiv1.CreateTenantResponse{Tenant: TenantProto(t)}, nil
		},
	})
}

// Get reads one tenant.
func (s *TenantService) Get(ctx context.Context, req *connect.Request[apiv1.GetTenantRequest]) (*connect.Response[apiv1.GetTenantResponse], error) {
	var vs envelope.Violations
	vs.Ref("tenant", req.Msg.GetTenant(), "tnt")
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t     Tenant
		found bool
	)
	if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		t, found, err = LookupTenant(ctx, q, req.Msg.GetTenant())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, TenantResource(t)); err != nil {
		return nil, err
	}
	if !found {
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", req.Msg.GetTenant()))
	}
	return connect.NewResponse(&apiv1.GetTenantResponse{Tenant: TenantProto(t)}), nil
}

// List lists every tenant; it is a platform-level read (tenant principals
// read their own tenant with Get).
func (s *TenantService) List(ctx context.Context, req *connect.Request[apiv1.ListTenantsRequest]) (*connect.Response[apiv1.ListTenantsResponse], error) {
	var vs envelope.Violations
	vs.PageSize("page_size", req.Msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	after, err := envelope.DecodePageToken("page_token", req.Msg.GetPageToken(), "")
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, PlatformResource()); err != nil {
		return nil, err
	}
	limit := envelope.PageSize(req.Msg.GetPageSize())
	var ts []Tenant
	if err := s.env.Resolve(ctx, "tenants", func(ctx context.Context, q store.Querier) (err error) {
		ts, err = TenantList(ctx, q, after, "", limit+1)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListTenantsResponse{}
	for i, t := range ts {
		if i == limit {
			out.NextPageToken = envelope.EncodePageToken(ts[i-1].ID, "")
			break
		}
		out.Tenants = append(out.Tenants, TenantProto(t))
	}
	return connect.NewResponse(out), nil
}

// TenantProto converts a tenant for the API.
func TenantProto(t Tenant) *apiv1.Tenant {
	return &apiv1.Tenant{Id: t.ID, Name: t.Name, DisplayName: t.DisplayName, State: t.State, CreateTime: timestamppb.New(t.CreateTime)}
}

// ProjectProto converts a project for the API.
func ProjectProto(p Project) *apiv1.Project {
	return &apiv1.Project{Id: p.ID, TenantId: p.TenantID, Name: p.Name, DisplayName: p.DisplayName, CreateTime: timestamppb.New(p.CreateTime)}
}

// AuthorizeTenantRead resolves the tenant a list names and makes the read
// decision on it, in the order that leaks nothing: a tenant that does not
// exist is decided as a platform-level resource (a tenant principal is
// refused without learning whether it exists) and only then reported as
// NOT_FOUND. Errors are Connect errors, ready to return.
func AuthorizeTenantRead(ctx context.Context, env *envelope.Envelope, ref string) (Tenant, error) {
	var (
		t     Tenant
		found bool
	)
	if err := env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		t, found, err = LookupTenant(ctx, q, ref)
		return err
	}); err != nil {
		return Tenant{}, env.Fail(ctx, err)
	}
	if err := env.AuthorizeRead(ctx, TenantResource(t)); err != nil {
		return Tenant{}, err
	}
	if !found {
		return Tenant{}, env.Fail(ctx, envelope.NotFound("tenant", ref))
	}
	return t, nil
}
