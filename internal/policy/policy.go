// Package policy stores each tenant's own Cedar policies and serves the
// PolicyService. It is the iam.PolicySource the embedded PDP reads.
//
// It must never accept a policy the validator refuses, nor serve one tenant's
// policies to another.
package policy

import (
	"context"
	"embed"
	"errors"
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

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("policy", migrationsFS)
}

// maxPolicyBytes caps a policy document.
const maxPolicyBytes = 64 << 10

// Policy is a stored tenant policy.
type Policy struct {
	TenantID   string
	ID         string
	Text       string
	UpdateTime time.Time
}

// Source reads tenant policies for the PDP.
type Source struct{ DB *store.DB }

// TenantPolicies implements iam.PolicySource.
func (s Source) TenantPolicies(ctx context.Context, tenantID string) ([]iam.TenantPolicy, error) {
	var out []iam.TenantPolicy
	err := s.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		ps, err := PolicyList(ctx, tx, tenantID, "", 10000)
		for _, p := range ps {
			out = append(out, iam.TenantPolicy{ID: p.ID, Text: p.Text})
		}
		return err
	})
	return out, err
}

// Validator checks a policy document before it is stored.
type Validator interface {
	Validate(id, text string) error
}

// Service serves the PolicyService API.
type Service struct {
	env       *envelope.Envelope
	validator Validator
}

var _ apiv1connect.PolicyServiceHandler = (*Service)(nil)

// NewService returns the policy handlers.
func NewService(env *envelope.Envelope, v Validator) *Service {
	return &Service{env: env, validator: v}
}

func policyResource(tenantID, id string) iam.Resource {
	return iam.Resource{Type: "Policy", ID: id, TenantID: tenantID}
}

// Get reads one policy.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetPolicyRequest]) (*connect.Response[apiv1.GetPolicyResponse], error) {
	var vs envelope.Violations
	vs.Ref("tenant", req.Msg.GetTenant(), "tnt")
	vs.Name("id", req.Msg.GetId())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t      tenancy.Tenant
		p      Policy
		tfound bool
	)
	if err := s.env.Resolve(ctx, "policy", func(ctx context.Context, q store.Querier) (err error) {
		if t, tfound, err = tenancy.LookupTenant(ctx, q, req.Msg.GetTenant()); err != nil || !tfound {
			return err
		}
		p, err = PolicyGet(ctx, q, t.ID, req.Msg.GetId())
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, policyResource(t.ID, req.Msg.GetId())); err != nil {
		return nil, err
	}
	switch {
	case !tfound:
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", req.Msg.GetTenant()))
	case p.ID == "":
		return nil, s.env.Fail(ctx, envelope.NotFound("policy", req.Msg.GetId()))
	}
	return connect.NewResponse(&apiv1.GetPolicyResponse{Policy: policyProto(p)}), nil
}

// Put validates and stores a policy; read decisions cached before it are
// dropped on this replica.
func (s *Service) Put(ctx context.Context, req *connect.Request[apiv1.PutPolicyRequest]) (*connect.Response[apiv1.PutPolicyResponse], error) {
	msg := req.Msg
	var (
		t      tenancy.Tenant
		tfound bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.PutPolicyResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			vs.Name("id", msg.GetId())
			vs.MaxLen("text", msg.GetText(), maxPolicyBytes)
			if len(vs) == 0 {
				if err := s.validator.Validate(msg.GetId(), msg.GetText()); err != nil {
					var ve *iam.ValidationError
					if errors.As(err, &ve) {
						vs.Add(ve.Field, "%s", ve.Reason)
					} else {
						vs.Add("text", "%s", err.Error())
					}
				}
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, tfound, err = tenancy.LookupTenant(ctx, q, msg.GetTenant())
			return policyResource(t.ID, msg.GetId()), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.PutPolicyResponse, error) {
			if !tfound {
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			}
			p := Policy{TenantID: t.ID, ID: msg.GetId(), Text: msg.GetText(), UpdateTime: tx.Now()}
			if err := PolicyUpsert(ctx, tx, p); err != nil {
				return nil, err
			}
			tx.AfterCommit(s.env.InvalidateReadDecisions)
			tx.Emit(envelope.Event{Type: "policy.updated", ResourceType: "Policy", ResourceID: p.ID})
			return &apiv1.PutPolicyResponse{Policy: policyProto(p)}, nil
		},
	})
}

// List lists a tenant's policies.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListPoliciesRequest]) (*connect.Response[apiv1.ListPoliciesResponse], error) {
	var vs envelope.Violations
	vs.Ref("tenant", req.Msg.GetTenant(), "tnt")
	vs.PageSize("page_size", req.Msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	after, err := envelope.DecodePageToken("page_token", req.Msg.GetPageToken(), req.Msg.GetTenant())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	t, err := tenancy.AuthorizeTenantRead(ctx, s.env, req.Msg.GetTenant())
	if err != nil {
		return nil, err
	}
	limit := envelope.PageSize(req.Msg.GetPageSize())
	var ps []Policy
	if err := s.env.Resolve(ctx, "policies", func(ctx context.Context, q store.Querier) (err error) {
		ps, err = PolicyList(ctx, q, t.ID, after, limit+1)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListPoliciesResponse{}
	for i, p := range ps {
		if i == limit {
			out.NextPageToken = envelope.EncodePageToken(ps[i-1].ID, req.Msg.GetTenant())
			break
		}
		out.Policies = append(out.Policies, policyProto(p))
	}
	return connect.NewResponse(out), nil
}

func policyProto(p Policy) *apiv1.Policy {
	return &apiv1.Policy{TenantId: p.TenantID, Id: p.ID, Text: p.Text, UpdateTime: timestamppb.New(p.UpdateTime)}
}
