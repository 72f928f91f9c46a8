package tenancy

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// ProjectResource projects a project into the authorization model.
func ProjectResource(p Project) iam.Resource {
	return iam.Resource{Type: "Project", ID: p.ID, TenantID: p.TenantID, ProjectID: p.ID, Attrs: map[string]any{"name": p.Name}}
}

// Create creates a project in a tenant.
func (s *ProjectService) Create(ctx context.Context, req *connect.Request[apiv1.CreateProjectRequest]) (*connect.Response[apiv1.CreateProjectResponse], error) {
	msg := req.Msg
	var tenant Tenant
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateProjectResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			vs.Name("name", msg.GetName())
			vs.MaxLen("display_name", msg.GetDisplayName(), 200)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if tenant, _, err = LookupTenant(ctx, q, msg.GetTenant()); err != nil {
				return iam.Resource{}, err
			}
			return iam.Resource{Type: "Project", ID: "draft", TenantID: tenant.ID, Attrs: map[string]any{"name": msg.GetName()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateProjectResponse, error) {
			if tenant.ID == "" {
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			}
			p := Project{ID: envelope.NewID("prj", tx.Now()), TenantID: tenant.ID, Name: msg.GetName(), DisplayName: msg.GetDisplayName(), CreateTime: tx.Now()}
			if p.DisplayName == "" {
				p.DisplayName = p.Name
			}
			if err := ProjectInsert(ctx, tx, p); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "project %q already exists in tenant %q", p.Name, tenant.Name)
				}
				if errors.Is(err, store.ErrConstraint) {
					return nil, envelope.NotFound("tenant", msg.GetTenant())
				}
				return nil, err
			}
			tx.SetResource(p.ID, "")
			tx.Emit(envelope.Event{Type: "project.created", ResourceType: "Project", ResourceID: p.ID, Data: map[string]any{"name": p.Name}})
			return &apiv1.CreateProjectResponse{Project: ProjectProto(p)}, nil
		},
	})
}

// Get reads one project.
func (s *ProjectService) Get(ctx context.Context, req *connect.Request[apiv1.GetProjectRequest]) (*connect.Response[apiv1.GetProjectResponse], error) {
	var vs envelope.Violations
	vs.Ref("tenant", req.Msg.GetTenant(), "tnt")
	vs.Ref("project", req.Msg.GetProject(), "prj")
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t      Tenant
		p      Project
		tfound bool
	)
	if err := s.env.Resolve(ctx, "project", func(ctx context.Context, q store.Querier) (err error) {
		if t, tfound, err = LookupTenant(ctx, q, req.Msg.GetTenant()); err != nil || !tfound {
			return err
		}
		p, err = ProjectGet(ctx, q, t.ID, req.Msg.GetProject())
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	// Decide before saying whether anything exists, so a stranger cannot
	// probe another tenant's names.
	res := ProjectResource(p)
	if p.ID == "" {
		res = iam.Resource{Type: "Project", ID: "unknown", TenantID: t.ID}
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	switch {
	case !tfound:
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", req.Msg.GetTenant()))
	case p.ID == "":
		return nil, s.env.Fail(ctx, envelope.NotFound("project", req.Msg.GetProject()))
	}
	return connect.NewResponse(&apiv1.GetProjectResponse{Project: ProjectProto(p)}), nil
}

// List lists a tenant's projects.
func (s *ProjectService) List(ctx context.Context, req *connect.Request[apiv1.ListProjectsRequest]) (*connect.Response[apiv1.ListProjectsResponse], error) {
	var vs envelope.Violations
	vs.Ref("tenant", req.Msg.GetTenant(), "tnt")
	vs.PageSize("page_size", req.Msg.GetPageSize())
	if req.Msg.GetNamePrefix() != "" {
		vs.Name("name_prefix", req.Msg.GetNamePrefix())
	}
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	after, err := envelope.DecodePageToken("page_token", req.Msg.GetPageToken(), req.Msg.GetTenant()+"/"+req.Msg.GetNamePrefix())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	t, err := AuthorizeTenantRead(ctx, s.env, req.Msg.GetTenant())
	if err != nil {
		return nil, err
	}
	limit := envelope.PageSize(req.Msg.GetPageSize())
	var ps []Project
	if err := s.env.Resolve(ctx, "projects", func(ctx context.Context, q store.Querier) (err error) {
		ps, err = ProjectList(ctx, q, t.ID, req.Msg.GetNamePrefix(), after, limit+1)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListProjectsResponse{}
	if len(ps) > limit {
		// The cursor follows the rows read, not those shown.
		out.NextPageToken = envelope.EncodePageToken(ps[limit-1].ID, req.Msg.GetTenant()+"/"+req.Msg.GetNamePrefix())
		ps = ps[:limit]
	}
	// Each project is decided as well, as Get decides it, so a policy
	// forbidding a project hides it from the list too.
	rf := s.env.NewReadFilter(TenantResource(t))
	for _, p := range ps {
		ok, err := rf.ReadableResource(ctx, ProjectResource(p))
		if err != nil {
			return nil, err
		}
		if ok {
			out.Projects = append(out.Projects, ProjectProto(p))
		}
	}
	return connect.NewResponse(out), nil
}

// Delete deletes a project. Agents need a human's confirmation (policy).
func (s *ProjectService) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteProjectRequest]) (*connect.Response[apiv1.DeleteProjectResponse], error) {
	msg := req.Msg
	var p Project
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteProjectResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			vs.Ref("project", msg.GetProject(), "prj")
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			t, found, err := LookupTenant(ctx, q, msg.GetTenant())
			if err != nil || !found {
				return iam.Resource{Type: "Project", ID: "unknown"}, err
			}
			if p, err = ProjectGet(ctx, q, t.ID, msg.GetProject()); err != nil {
				if errors.Is(err, store.ErrNotFound) {
					// Decide on the tenant first; Apply reports NOT_FOUND.
					return iam.Resource{Type: "Project", ID: "unknown", TenantID: t.ID}, nil
				}
				return iam.Resource{}, err
			}
			return ProjectResource(p), nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteProjectResponse, error) {
			if p.ID == "" {
				return nil, envelope.NotFound("project", msg.GetProject())
			}
			ok, err := ProjectDelete(ctx, tx, p.TenantID, p.ID)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.NotFound("project", msg.GetProject())
			}
			tx.Emit(envelope.Event{Type: "project.deleted", ResourceType: "Project", ResourceID: p.ID, Data: map[string]any{"name": p.Name}})
			return &apiv1.DeleteProjectResponse{}, nil
		},
	})
}
