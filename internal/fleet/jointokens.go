package fleet

import (
	"cmp"
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/attestor"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// JoinTokenService serves the JoinTokenService API.
type JoinTokenService struct {
	env  *envelope.Envelope
	deps Deps
}

// NewJoinTokenService returns the join token handlers.
func NewJoinTokenService(env *envelope.Envelope, deps Deps) *JoinTokenService {
	return &JoinTokenService{env: env, deps: deps}
}

var _ apiv1connect.JoinTokenServiceHandler = (*JoinTokenService)(nil)

// Join token lifetimes.
const (
	defaultJoinTokenTTL = time.Hour
	maxJoinTokenTTL     = 7 * 24 * time.Hour
)

// JoinTokenResource projects a join token into the authorization model.
func JoinTokenResource(t JoinToken) iam.Resource {
	return iam.Resource{Type: "JoinToken", ID: t.ID, TenantID: t.TenantID, ProjectID: t.ProjectID, Attrs: map[string]any{"pool": t.Pool}}
}

// Create mints a join token: the row is stored, the sealed token is
// returned once.
func (s *JoinTokenService) Create(ctx context.Context, req *connect.Request[apiv1.CreateJoinTokenRequest]) (*connect.Response[apiv1.CreateJoinTokenResponse], error) {
	msg := req.Msg
	var (
		tenant    tenancy.Tenant
		project   tenancy.Project
		siteID    string
		siteFound bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateJoinTokenResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			vs.Ref("project", msg.GetProject(), "prj")
			vs.OptionalName("pool", msg.GetPool())
			validateLabels(&vs, "labels", msg.GetLabels())
			validateOneOf(&vs, "role", msg.GetRole(), JoinTokenRoles...)
			validateOneOf(&vs, "attestor", msg.GetAttestor(), attestor.Kinds...)
			if msg.GetSite() != "" {
				if msg.GetRole() != RoleSite {
					vs.Add("site", "only a site token (role site) is bound to a site")
				} else {
					vs.Ref("site", msg.GetSite(), "site")
				}
			}
			// Compare in seconds: multiplying first overflows and wraps a huge
			// ttl into an already-expired token.
			if ttl := msg.GetTtlSeconds(); ttl < 0 || ttl > int64(maxJoinTokenTTL/time.Second) {
				vs.Add("ttl_seconds", "must be between 1 and %d (0 means %d)", int64(maxJoinTokenTTL/time.Second), int64(defaultJoinTokenTTL/time.Second))
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			t, found, err := tenancy.LookupTenant(ctx, q, msg.GetTenant())
			if err != nil || !found {
				return iam.Resource{Type: "JoinToken", ID: iam.DraftID}, err
			}
			tenant = t
			if project, err = tenancy.ProjectGet(ctx, q, t.ID, msg.GetProject()); err != nil && !errors.Is(err, store.ErrNotFound) {
				return iam.Resource{}, err
			}
			if msg.GetSite() != "" {
				if s.deps.Sites == nil {
					return iam.Resource{}, errNotWired("site resolver")
				}
				if siteID, siteFound, err = s.deps.Sites.ResolveSite(ctx, q, t.ID, msg.GetSite()); err != nil {
					return iam.Resource{}, err
				}
			}
			return iam.Resource{Type: "JoinToken", ID: iam.DraftID, TenantID: t.ID, ProjectID: project.ID,
				Attrs: map[string]any{"pool": msg.GetPool()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateJoinTokenResponse, error) {
			switch {
			case s.deps.Sealer == nil:
				return nil, errNotWired("join token sealer")
			case tenant.ID == "":
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			case project.ID == "":
				return nil, envelope.NotFound("project", msg.GetProject())
			case msg.GetSite() != "" && !siteFound:
				return nil, envelope.NotFound("site", msg.GetSite())
			}
			if msg.GetAttestor() != "" {
				// A token no anchor can satisfy would only fail at join,
				// on the machine; say so to the operator now.
				anchors, err := TrustAnchorList(ctx, tx, &TrustAnchorListParams{TenantID: tenant.ID, Attestor: msg.GetAttestor(), Limit: 1})
				if err != nil {
					return nil, err
				}
				if len(anchors) == 0 {
					return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
						"attestor: tenant %s has no %s trust anchor; register one first (better-compute trust-anchors create)", tenant.Name, msg.GetAttestor())
				}
			}
			labels, err := labelsJSON(msg.GetLabels())
			if err != nil {
				return nil, err
			}
			ttl := time.Duration(msg.GetTtlSeconds()) * time.Second
			if ttl == 0 {
				ttl = defaultJoinTokenTTL
			}
			now := tx.Now()
			jt := JoinToken{
				ID: envelope.NewID(JoinTokenIDPrefix, now), TenantID: tenant.ID, ProjectID: project.ID, Pool: msg.GetPool(),
				Labels: labels, CreatedBy: tx.Caller().Principal.ID, CreateTime: now, ExpireTime: now.Add(ttl),
				Role: cmp.Or(msg.GetRole(), RoleNode), SiteID: siteID, Attestor: msg.GetAttestor(),
			}
			if err := JoinTokenInsert(ctx, tx, &jt); err != nil {
				return nil, err
			}
			token, err := s.deps.Sealer.SealJoinToken(JoinClaims{
				TokenID: jt.ID, TenantID: jt.TenantID, ProjectID: jt.ProjectID, Pool: jt.Pool,
				Labels: msg.GetLabels(), ExpiresAt: jt.ExpireTime,
			})
			if err != nil {
				return nil, err
			}
			tx.SetResource(jt.ID, "")
			tx.Emit(envelope.Event{Type: "jointoken.created", TenantID: jt.TenantID, ResourceType: "JoinToken", ResourceID: jt.ID,
				Data: map[string]any{"project_id": jt.ProjectID, "pool": jt.Pool, "role": jt.Role, "site_id": jt.SiteID, "attestor": jt.Attestor, "expire_time": jt.ExpireTime.UTC().Format(time.RFC3339)}})
			return &apiv1.CreateJoinTokenResponse{JoinToken: JoinTokenProto(jt, now), Token: token}, nil
		},
		// The replay copy sits in the database: it must not hold the token.
		Replayable: func(res *apiv1.CreateJoinTokenResponse) *apiv1.CreateJoinTokenResponse {
			out := proto.CloneOf(res)
			out.Token = ""
			return out
		},
	})
}

// List lists join tokens; the tokens themselves are never returned.
func (s *JoinTokenService) List(ctx context.Context, req *connect.Request[apiv1.ListJoinTokensRequest]) (*connect.Response[apiv1.ListJoinTokensResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateTenant(&vs, msg.GetTenant())
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := msg.GetTenant()
	if msg.GetIncludeInactive() {
		filter += "/inactive"
	}
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
	var tokens []JoinToken
	if err := s.env.Resolve(ctx, "join tokens", func(ctx context.Context, q store.Querier) (err error) {
		tokens, err = JoinTokenList(ctx, q, &JoinTokenListParams{TenantID: t.ID, IncludeInactive: msg.GetIncludeInactive(), After: after, Limit: limit + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	now := s.env.Clock().Now()
	out := &apiv1.ListJoinTokensResponse{}
	if len(tokens) > limit {
		// The cursor follows the rows read, not those shown.
		out.NextPageToken = envelope.EncodePageToken(tokens[limit-1].ID, filter)
		tokens = tokens[:limit]
	}
	// Tokens of a project are decided on the project too, once per project.
	tokens, err = envelope.KeepReadable(ctx, s.env.NewReadFilter(res), tokens, func(jt JoinToken) (string, string) { return jt.TenantID, jt.ProjectID })
	if err != nil {
		return nil, err
	}
	for _, jt := range tokens {
		out.JoinTokens = append(out.JoinTokens, JoinTokenProto(jt, now))
	}
	return connect.NewResponse(out), nil
}

// Revoke revokes a join token that was not used yet.
func (s *JoinTokenService) Revoke(ctx context.Context, req *connect.Request[apiv1.RevokeJoinTokenRequest]) (*connect.Response[apiv1.RevokeJoinTokenResponse], error) {
	msg := req.Msg
	var (
		tenantID string
		jt       JoinToken
		found    bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.RevokeJoinTokenResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateTenant(&vs, msg.GetTenant())
			vs.ID("id", msg.GetId(), JoinTokenIDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			if msg.GetTenant() != "" {
				t, tfound, err := tenancy.LookupTenant(ctx, q, msg.GetTenant())
				if err != nil || !tfound {
					return iam.Resource{Type: "JoinToken", ID: "unknown"}, err
				}
				tenantID = t.ID
			}
			var err error
			jt, err = JoinTokenGet(ctx, q, tenantID, msg.GetId())
			if errors.Is(err, store.ErrNotFound) {
				return iam.Resource{Type: "JoinToken", ID: "unknown", TenantID: tenantID}, nil
			}
			found = err == nil
			return JoinTokenResource(jt), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.RevokeJoinTokenResponse, error) {
			if !found {
				if msg.GetTenant() != "" && tenantID == "" {
					return nil, envelope.NotFound("tenant", msg.GetTenant())
				}
				return nil, envelope.NotFound("join token", msg.GetId())
			}
			ok, err := JoinTokenRevoke(ctx, tx, jt.TenantID, jt.ID)
			if err != nil {
				return nil, err
			}
			cur, err := JoinTokenGet(ctx, tx, jt.TenantID, jt.ID)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "join token %s is already %s", jt.ID, cur.State(tx.Now()))
			}
			tx.Emit(envelope.Event{Type: "jointoken.revoked", TenantID: jt.TenantID, ResourceType: "JoinToken", ResourceID: jt.ID})
			return &apiv1.RevokeJoinTokenResponse{JoinToken: JoinTokenProto(cur, tx.Now())}, nil
		},
	})
}
