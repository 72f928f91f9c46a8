// Package confirmation serves the ConfirmationService: listing the
// confirmations policy demanded in a tenant and letting a human approve one.
// The envelope creates and spends confirmations; this package only exposes
// them.
//
// It must never let a non-human principal approve, nor approve across
// tenants.
package confirmation

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
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Service serves the ConfirmationService API.
type Service struct{ env *envelope.Envelope }

var _ apiv1connect.ConfirmationServiceHandler = (*Service)(nil)

// NewService returns the confirmation handlers.
func NewService(env *envelope.Envelope) *Service { return &Service{env: env} }

var states = map[string]bool{"": true, envelope.ConfirmationPending: true, envelope.ConfirmationApproved: true,
	envelope.ConfirmationUsed: true, envelope.ConfirmationExpired: true}

// List lists a tenant's confirmations.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListConfirmationsRequest]) (*connect.Response[apiv1.ListConfirmationsResponse], error) {
	var vs envelope.Violations
	vs.Ref("tenant", req.Msg.GetTenant(), "tnt")
	vs.PageSize("page_size", req.Msg.GetPageSize())
	if !states[req.Msg.GetState()] {
		vs.Add("state", "must be pending, approved, used or expired, got %q", req.Msg.GetState())
	}
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := req.Msg.GetTenant() + "/" + req.Msg.GetState()
	after, err := envelope.DecodePageToken("page_token", req.Msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	t, err := tenancy.AuthorizeTenantRead(ctx, s.env, req.Msg.GetTenant())
	if err != nil {
		return nil, err
	}
	limit := envelope.PageSize(req.Msg.GetPageSize())
	var cs []envelope.Confirmation
	if err := s.env.Resolve(ctx, "confirmations", func(ctx context.Context, q store.Querier) (err error) {
		cs, err = envelope.ConfirmationList(ctx, q, envelope.ConfirmationListParams{TenantID: t.ID, State: req.Msg.GetState(), After: after, Limit: limit + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListConfirmationsResponse{}
	for i, c := range cs {
		if i == limit {
			out.NextPageToken = envelope.EncodePageToken(cs[i-1].ID, filter)
			break
		}
		out.Confirmations = append(out.Confirmations, Proto(c))
	}
	return connect.NewResponse(out), nil
}

// Approve lets one replay of the confirmed request through. Only a human
// principal may approve.
func (s *Service) Approve(ctx context.Context, req *connect.Request[apiv1.ApproveConfirmationRequest]) (*connect.Response[apiv1.ApproveConfirmationResponse], error) {
	msg := req.Msg
	var c envelope.Confirmation
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.ApproveConfirmationResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			vs.ID("id", msg.GetId(), "cfm")
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			t, tfound, err := tenancy.LookupTenant(ctx, q, msg.GetTenant())
			if err != nil || !tfound {
				return iam.Resource{Type: "Confirmation", ID: "unknown"}, err
			}
			c, err = envelope.ConfirmationGet(ctx, q, msg.GetId())
			if errors.Is(err, store.ErrNotFound) || (err == nil && c.TenantID != t.ID) {
				c = envelope.Confirmation{}
				return iam.Resource{Type: "Confirmation", ID: "unknown", TenantID: t.ID}, nil
			}
			return iam.Resource{Type: "Confirmation", ID: c.ID, TenantID: c.TenantID,
				Attrs: map[string]any{"action": c.Action, "requestedBy": c.PrincipalID}}, err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.ApproveConfirmationResponse, error) {
			caller := tx.Caller()
			switch {
			case c.ID == "":
				return nil, envelope.NotFound("confirmation", msg.GetId())
			case !caller.Human():
				return nil, envelope.Errorf(envelope.CodePermissionDenied, "a confirmation is approved by a human (user) principal, not a %s", caller.Principal.Kind)
			case caller.Principal.ID == c.PrincipalID:
				return nil, envelope.Errorf(envelope.CodePermissionDenied, "a principal cannot approve its own request")
			}
			if err := envelope.ConfirmationApprove(ctx, tx, c.ID, caller.Principal.ID); err != nil {
				return nil, err
			}
			c.State, c.ApprovedBy = envelope.ConfirmationApproved, caller.Principal.ID
			tx.Emit(envelope.Event{Type: "confirmation.approved", ResourceType: "Confirmation", ResourceID: c.ID,
				Data: map[string]any{"action": c.Action, "approvedBy": c.ApprovedBy}})
			return &apiv1.ApproveConfirmationResponse{Confirmation: Proto(c)}, nil
		},
	})
}

// Proto converts a confirmation for the API.
func Proto(c envelope.Confirmation) *apiv1.Confirmation {
	return &apiv1.Confirmation{
		Id: c.ID, TenantId: c.TenantID, Action: c.Action, ResourceType: c.ResourceType, ResourceId: c.ResourceID,
		PrincipalId: c.PrincipalID, State: c.State, ApprovedBy: c.ApprovedBy,
		CreateTime: timestamppb.New(c.CreateTime), ExpireTime: timestamppb.New(c.ExpireTime),
	}
}
