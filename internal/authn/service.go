package authn

import (
	"context"
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

// maxKeyTTL bounds an API key's lifetime.
const maxKeyTTL = 10 * 365 * 24 * time.Hour

// ApiKeyService serves the ApiKeyService API.
type ApiKeyService struct {
	env *envelope.Envelope
}

// IdentityService serves WhoAmI.
type IdentityService struct {
	env *envelope.Envelope
}

var (
	_ apiv1connect.ApiKeyServiceHandler   = (*ApiKeyService)(nil)
	_ apiv1connect.IdentityServiceHandler = (*IdentityService)(nil)
)

// NewApiKeyService returns the API key handlers. A create or revocation
// moves the directory version on (KeyInsert, KeyRevoke), which every
// replica's authenticator checks on the next request: nothing to notify.
func NewApiKeyService(env *envelope.Envelope) *ApiKeyService {
	return &ApiKeyService{env: env}
}

// NewIdentityService returns the WhoAmI handler.
func NewIdentityService(env *envelope.Envelope) *IdentityService { return &IdentityService{env: env} }

func keyResource(tenantID, id, role string) iam.Resource {
	return iam.Resource{Type: "ApiKey", ID: id, TenantID: tenantID, Attrs: map[string]any{"role": role}}
}

// Create issues a key and returns its secret once.
func (s *ApiKeyService) Create(ctx context.Context, req *connect.Request[apiv1.CreateApiKeyRequest]) (*connect.Response[apiv1.CreateApiKeyResponse], error) {
	msg := req.Msg
	var (
		tenant tenancy.Tenant
		found  bool
	)
	role := msg.GetRole()
	if msg.GetTenant() == "" && role == "" {
		role = string(iam.RolePlatformAdmin)
	}
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateApiKeyResponse]{
		Validate: func() error {
			var vs envelope.Violations
			if msg.GetTenant() != "" {
				vs.Ref("tenant", msg.GetTenant(), "tnt")
				switch iam.Role(role) {
				case iam.RoleAdmin, iam.RoleOperator, iam.RoleMember, iam.RoleViewer, iam.RoleAgent:
				case "":
					vs.Add("role", "is required: admin, operator, member, viewer or agent")
				default:
					vs.Add("role", "must be admin, operator, member, viewer or agent, got %q", role)
				}
			} else if iam.Role(role) != iam.RolePlatformAdmin {
				vs.Add("role", "a platform key (no tenant) must have role platform-admin, got %q", role)
			}
			if msg.GetPerson() && iam.Role(role) == iam.RoleAgent {
				vs.Add("person", "an agent's key acts for someone and cannot be a person's")
			}
			vs.OptionalName("name", msg.GetName())
			// Compare in seconds: multiplying first overflows and wraps a huge
			// ttl into an already-expired key.
			if ttl := msg.GetTtlSeconds(); ttl < 0 || ttl > int64(maxKeyTTL/time.Second) {
				vs.Add("ttl_seconds", "must be between 0 (no expiry) and %d", int64(maxKeyTTL/time.Second))
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			if msg.GetTenant() == "" {
				return keyResource("", iam.DraftID, role), nil
			}
			var err error
			tenant, found, err = tenancy.LookupTenant(ctx, q, msg.GetTenant())
			return keyResource(tenant.ID, iam.DraftID, role), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateApiKeyResponse, error) {
			if msg.GetTenant() != "" && !found {
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			}
			if msg.GetPerson() {
				// A person's key can approve others' confirmations, so only a
				// person who is a platform admin vouches for a new one: not a
				// service key, nor a tenant admin of any kind.
				c := tx.Caller()
				if !c.Human() || c.Principal.Role != iam.RolePlatformAdmin {
					return nil, envelope.Errorf(envelope.CodePermissionDenied,
						"a person's key (person: true) is made by a person with the platform-admin role; %s is not", c.Principal.ID)
				}
			}
			secret, hash, err := NewSecret()
			if err != nil {
				return nil, err
			}
			k := ApiKey{
				ID: envelope.NewID("key", tx.Now()), TenantID: tenant.ID, Name: msg.GetName(), Role: role,
				Kind: string(iam.KindService), Prefix: secret[:prefixShown], SecretHash: hash,
				CreatedBy: tx.Caller().Principal.ID, CreateTime: tx.Now(),
			}
			if k.Name == "" {
				k.Name = role
			}
			switch {
			case iam.Role(role) == iam.RoleAgent:
				k.Kind = string(iam.KindAgent)
			case msg.GetPerson():
				k.Kind = string(iam.KindUser)
			}
			if ttl := msg.GetTtlSeconds(); ttl > 0 {
				exp := tx.Now().Add(time.Duration(ttl) * time.Second)
				k.ExpireTime = &exp
			}
			if err := KeyInsert(ctx, tx, k); err != nil {
				return nil, err
			}
			tx.SetResource(k.ID, "")
			tx.Emit(envelope.Event{Type: "apikey.created", ResourceType: "ApiKey", ResourceID: k.ID, Data: map[string]any{"name": k.Name, "role": k.Role, "kind": k.Kind}})
			return &apiv1.CreateApiKeyResponse{ApiKey: KeyProto(k), Secret: secret}, nil
		},
		// The secret is shown once: a replay names the key it created but
		// cannot show the secret again (only its hash is kept).
		Replayable: func(res *apiv1.CreateApiKeyResponse) *apiv1.CreateApiKeyResponse {
			return &apiv1.CreateApiKeyResponse{ApiKey: res.GetApiKey()}
		},
	})
}

// List lists a tenant's keys (never their secrets).
func (s *ApiKeyService) List(ctx context.Context, req *connect.Request[apiv1.ListApiKeysRequest]) (*connect.Response[apiv1.ListApiKeysResponse], error) {
	var vs envelope.Violations
	if req.Msg.GetTenant() != "" {
		vs.Ref("tenant", req.Msg.GetTenant(), "tnt")
	}
	vs.PageSize("page_size", req.Msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := req.Msg.GetTenant()
	if req.Msg.GetIncludeRevoked() {
		filter += "/revoked"
	}
	after, err := envelope.DecodePageToken("page_token", req.Msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	t, found, err := s.container(ctx, req.Msg.GetTenant())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	res := tenancy.TenantResource(t)
	if req.Msg.GetTenant() == "" {
		res = tenancy.PlatformResource()
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	if !found {
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", req.Msg.GetTenant()))
	}
	limit := envelope.PageSize(req.Msg.GetPageSize())
	var keys []ApiKey
	if err := s.env.Resolve(ctx, "api keys", func(ctx context.Context, q store.Querier) (err error) {
		keys, err = KeyList(ctx, q, t.ID, req.Msg.GetIncludeRevoked(), after, limit+1)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListApiKeysResponse{}
	for i, k := range keys {
		if i == limit {
			out.NextPageToken = envelope.EncodePageToken(keys[i-1].ID, filter)
			break
		}
		out.ApiKeys = append(out.ApiKeys, KeyProto(k))
	}
	return connect.NewResponse(out), nil
}

// container resolves the tenant a key call names; "" means the platform,
// which projects as the Platform (only platform admins pass).
func (s *ApiKeyService) container(ctx context.Context, ref string) (tenancy.Tenant, bool, error) {
	if ref == "" {
		return tenancy.Tenant{}, true, nil
	}
	var (
		t     tenancy.Tenant
		found bool
	)
	err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		t, found, err = tenancy.LookupTenant(ctx, q, ref)
		return err
	})
	return t, found, err
}

// Revoke revokes a key at once (tenant admins and platform admins only).
func (s *ApiKeyService) Revoke(ctx context.Context, req *connect.Request[apiv1.RevokeApiKeyRequest]) (*connect.Response[apiv1.RevokeApiKeyResponse], error) {
	msg := req.Msg
	var (
		k     ApiKey
		found bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.RevokeApiKeyResponse]{
		Validate: func() error {
			var vs envelope.Violations
			if msg.GetTenant() != "" {
				vs.Ref("tenant", msg.GetTenant(), "tnt")
			}
			vs.ID("id", msg.GetId(), "key")
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			tenantID := ""
			if msg.GetTenant() != "" {
				t, tfound, err := tenancy.LookupTenant(ctx, q, msg.GetTenant())
				if err != nil || !tfound {
					return keyResource("", "unknown", ""), err
				}
				tenantID = t.ID
			} else if c, ok := envelope.CallerFrom(ctx); ok {
				// No tenant named: a tenant principal means its own tenant
				// (a key elsewhere is not found, as if named under it); a
				// platform principal finds the key by id in any tenant.
				tenantID = c.Principal.TenantID
			}
			var err error
			if msg.GetTenant() == "" && tenantID == "" {
				k, err = KeyByID(ctx, q, msg.GetId())
			} else {
				k, err = KeyGet(ctx, q, tenantID, msg.GetId())
			}
			if errors.Is(err, store.ErrNotFound) {
				// A key of another tenant named under this one is not found
				// here: decide on the named tenant, then say NOT_FOUND.
				return keyResource(tenantID, "unknown", ""), nil
			}
			found = err == nil
			return keyResource(k.TenantID, k.ID, k.Role), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.RevokeApiKeyResponse, error) {
			if !found {
				return nil, envelope.NotFound("api key", msg.GetId())
			}
			ok, err := KeyRevoke(ctx, tx, k.TenantID, k.ID)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "api key %s is already revoked", k.ID)
			}
			now := tx.Now()
			k.RevokeTime = &now
			tx.Emit(envelope.Event{Type: "apikey.revoked", ResourceType: "ApiKey", ResourceID: k.ID, Data: map[string]any{"name": k.Name}})
			return &apiv1.RevokeApiKeyResponse{ApiKey: KeyProto(k)}, nil
		},
	})
}

// WhoAmI tells the caller who it is; it needs no decision.
func (s *IdentityService) WhoAmI(ctx context.Context, _ *connect.Request[apiv1.WhoAmIRequest]) (*connect.Response[apiv1.WhoAmIResponse], error) {
	c, _ := envelope.CallerFrom(ctx)
	out := &apiv1.WhoAmIResponse{
		PrincipalId: c.Principal.ID, Kind: string(c.Principal.Kind), Name: c.Principal.Name,
		Role: string(c.Principal.Role), TenantId: c.Principal.TenantID, AuthenticatedBy: c.AuthenticatedBy,
	}
	if c.Principal.TenantID != "" {
		if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) error {
			t, err := tenancy.TenantGet(ctx, q, c.Principal.TenantID)
			out.TenantName = t.Name
			return err
		}); err != nil {
			return nil, s.env.Fail(ctx, err)
		}
	}
	return connect.NewResponse(out), nil
}

// KeyProto converts a key for the API; it never carries the secret.
func KeyProto(k ApiKey) *apiv1.ApiKey {
	out := &apiv1.ApiKey{
		Id: k.ID, TenantId: k.TenantID, Name: k.Name, Role: k.Role, Kind: k.Kind, Prefix: k.Prefix,
		CreateTime: timestamppb.New(k.CreateTime),
	}
	if k.ExpireTime != nil {
		out.ExpireTime = timestamppb.New(*k.ExpireTime)
	}
	if k.RevokeTime != nil {
		out.RevokeTime = timestamppb.New(*k.RevokeTime)
	}
	return out
}
