package fleet

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// JoinRequestService serves the JoinRequestService API.
type JoinRequestService struct {
	env *envelope.Envelope
}

// NewJoinRequestService returns the join request handlers.
func NewJoinRequestService(env *envelope.Envelope) *JoinRequestService {
	return &JoinRequestService{env: env}
}

var _ apiv1connect.JoinRequestServiceHandler = (*JoinRequestService)(nil)

var joinRequestStates = []string{JoinRequestPending, JoinRequestApproved, JoinRequestRejected, JoinRequestAdmitted}

// JoinRequestResource projects a join request into the authorization model.
func JoinRequestResource(r JoinRequest) iam.Resource {
	return iam.Resource{Type: "JoinRequest", ID: r.ID, TenantID: r.TenantID}
}

// List lists join requests of a tenant, or of every tenant for platform
// admins.
func (s *JoinRequestService) List(ctx context.Context, req *connect.Request[apiv1.ListJoinRequestsRequest]) (*connect.Response[apiv1.ListJoinRequestsResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateTenant(&vs, msg.GetTenant())
	validateOneOf(&vs, "state", msg.GetState(), joinRequestStates...)
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := msg.GetTenant() + "/" + msg.GetState()
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	t, found, res, err := container(ctx, s.env, msg.GetTenant())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	if !found {
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", msg.GetTenant()))
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var reqs []JoinRequest
	if err := s.env.Resolve(ctx, "join requests", func(ctx context.Context, q store.Querier) (err error) {
		reqs, err = JoinRequestList(ctx, q, &JoinRequestListParams{TenantID: t.ID, State: msg.GetState(), After: after, Limit: limit + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListJoinRequestsResponse{}
	for i, r := range reqs {
		if i == limit {
			out.NextPageToken = envelope.EncodePageToken(reqs[i-1].ID, filter)
			break
		}
		out.JoinRequests = append(out.JoinRequests, JoinRequestProto(r))
	}
	return connect.NewResponse(out), nil
}

// Approve admits the deferred join: the machine's next join attempt with the
// same token and CSR succeeds, once.
func (s *JoinRequestService) Approve(ctx context.Context, req *connect.Request[apiv1.ApproveJoinRequestRequest]) (*connect.Response[apiv1.ApproveJoinRequestResponse], error) {
	res, err := decide(ctx, s.env, req, req.Msg.GetTenant(), req.Msg.GetId(), JoinRequestApproved)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.ApproveJoinRequestResponse{JoinRequest: res}), nil
}

// Reject refuses the deferred join for good.
func (s *JoinRequestService) Reject(ctx context.Context, req *connect.Request[apiv1.RejectJoinRequestRequest]) (*connect.Response[apiv1.RejectJoinRequestResponse], error) {
	res, err := decide(ctx, s.env, req, req.Msg.GetTenant(), req.Msg.GetId(), JoinRequestRejected)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.RejectJoinRequestResponse{JoinRequest: res}), nil
}

// decide approves or rejects a pending join request.
func decide[Req any](ctx context.Context, env *envelope.Envelope, req *connect.Request[Req], tenantRef, id, state string) (*apiv1.JoinRequest, error) {
	var (
		tenantID string
		jr       JoinRequest
		found    bool
	)
	res, err := envelope.Mutate(ctx, env, req, envelope.Mutation[apiv1.JoinRequest]{
		Validate: func() error {
			var vs envelope.Violations
			validateTenant(&vs, tenantRef)
			vs.ID("id", id, JoinRequestIDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			if tenantRef != "" {
				t, tfound, err := tenancy.LookupTenant(ctx, q, tenantRef)
				if err != nil || !tfound {
					return iam.Resource{Type: "JoinRequest", ID: "unknown"}, err
				}
				tenantID = t.ID
			}
			var err error
			jr, err = JoinRequestGet(ctx, q, tenantID, id)
			if errors.Is(err, store.ErrNotFound) {
				return iam.Resource{Type: "JoinRequest", ID: "unknown", TenantID: tenantID}, nil
			}
			found = err == nil
			return JoinRequestResource(jr), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.JoinRequest, error) {
			if !found {
				if tenantRef != "" && tenantID == "" {
					return nil, envelope.NotFound("tenant", tenantRef)
				}
				return nil, envelope.NotFound("join request", id)
			}
			ok, err := JoinRequestDecide(ctx, tx, &JoinRequestDecideParams{TenantID: jr.TenantID, ID: jr.ID, State: state, DecidedBy: tx.Caller().Principal.ID})
			if err != nil {
				return nil, err
			}
			cur, err := JoinRequestGet(ctx, tx, jr.TenantID, jr.ID)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "join request %s is %s: only a pending request can be decided", jr.ID, cur.State)
			}
			tx.Emit(envelope.Event{Type: "joinrequest." + state, TenantID: jr.TenantID, ResourceType: "JoinRequest", ResourceID: jr.ID,
				Data: map[string]any{"token_id": jr.TokenID, "identity": jr.Identity}})
			return JoinRequestProto(cur), nil
		},
	})
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}
