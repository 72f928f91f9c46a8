package provideraccounts

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/providers"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Limits on what an account holds.
const (
	maxFields     = 32
	maxValueLen   = 1024
	maxEndpoint   = 512
	maxFieldName  = 64
	typeFieldName = "type"
)

// Service serves ProviderAccountService.
type Service struct {
	env *envelope.Envelope
}

// NewService returns the handlers.
func NewService(env *envelope.Envelope) *Service { return &Service{env: env} }

var _ apiv1connect.ProviderAccountServiceHandler = (*Service)(nil)

// Resource projects an account into the authorization model.
func Resource(a Account) iam.Resource {
	return iam.Resource{Type: "ProviderAccount", ID: a.ID, TenantID: a.TenantID, Attrs: map[string]any{"name": a.Name, "type": a.Type}}
}

// Proto is the API's view of an account: its references, never a value.
func Proto(a Account) *apiv1.ProviderAccount {
	return &apiv1.ProviderAccount{Id: a.ID, TenantId: a.TenantID, Name: a.Name, Type: a.Type, Settings: a.Settings,
		SecretRefs: a.SecretRefs, Endpoint: a.Endpoint, CreatedBy: a.CreatedBy, CreateTime: timestamppb.New(a.CreateTime)}
}

type target struct {
	sc    tenancy.Scope
	a     Account
	found bool
}

func (t target) resource() iam.Resource {
	if t.found {
		return Resource(t.a)
	}
	return t.sc.Missing("ProviderAccount")
}

func lookup(ctx context.Context, q store.Querier, tenantRef, ref string) (target, error) {
	var t target
	var err error
	if t.sc, err = tenancy.LookupScope(ctx, q, tenantRef); err != nil || !t.sc.Found {
		return t, err
	}
	t.a, err = Get(ctx, q, t.sc.ID(), ref, "")
	switch {
	case errors.Is(err, store.ErrNotFound):
		return t, nil
	case err != nil:
		return t, err
	}
	t.found = true
	return t, nil
}

// validateFields checks a map's keys and values and, against the type's
// manifest, which fields are settings and which are credentials.
func validateFields(vs *envelope.Violations, field string, m map[string]string) {
	if len(m) > maxFields {
		vs.Add(field, "at most %d entries, got %d", maxFields, len(m))
		return
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if k == "" || len(k) > maxFieldName {
			vs.Add(field, "has a key of %d bytes: keys are 1 to %d bytes", len(k), maxFieldName)
			continue
		}
		vs.MaxLen(field+"."+k, m[k], maxValueLen)
	}
}

// Create adds an account.
func (s *Service) Create(ctx context.Context, req *connect.Request[apiv1.CreateProviderAccountRequest]) (*connect.Response[apiv1.CreateProviderAccountResponse], error) {
	msg := req.Msg
	var sc tenancy.Scope
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateProviderAccountResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Name("name", msg.GetName())
			validateFields(&vs, "settings", msg.GetSettings())
			validateFields(&vs, "secret_refs", msg.GetSecretRefs())
			f, ok := providers.Lookup(msg.GetType())
			switch {
			case msg.GetType() == "":
				vs.Add(typeFieldName, "is required: one of %s", strings.Join(providers.Types(), ", "))
			case !ok:
				vs.Add(typeFieldName, "must be one of %s, got %q", strings.Join(providers.Types(), ", "), truncate(msg.GetType()))
			default:
				problems := f.Manifest.Validate(msg.GetSettings(), msg.GetSecretRefs())
				for _, k := range slices.Sorted(maps.Keys(problems)) {
					// Name the map the caller put the field in, or, for a
					// missing one, the map it belongs in.
					_, inSettings := msg.GetSettings()[k]
					_, inRefs := msg.GetSecretRefs()[k]
					where := "settings." + k
					if inRefs || !inSettings && fieldSecret(f.Manifest, k) {
						where = "secret_refs." + k
					}
					vs.Add(where, "%s", problems[k])
				}
			}
			for _, k := range slices.Sorted(maps.Keys(msg.GetSecretRefs())) {
				if _, ok := secrets.ParseRef(msg.GetSecretRefs()[k]); !ok {
					vs.Add("secret_refs."+k, "must be a secret reference secret://<name>")
				}
			}
			if e := msg.GetEndpoint(); e != "" {
				u, err := url.Parse(e)
				switch {
				case len(e) > maxEndpoint:
					vs.Add("endpoint", "at most %d bytes", maxEndpoint)
				case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil:
					vs.Add("endpoint", "must be an http(s) URL without credentials, got %q", truncate(e))
				}
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant()); err != nil || !sc.Found {
				return iam.Resource{Type: "ProviderAccount", ID: iam.DraftID}, err
			}
			return iam.Resource{Type: "ProviderAccount", ID: iam.DraftID, TenantID: sc.ID(),
				Attrs: map[string]any{"name": msg.GetName(), "type": msg.GetType()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateProviderAccountResponse, error) {
			if err := sc.NotFound(); err != nil {
				return nil, err
			}
			if sc.Platform {
				return nil, envelope.Invalid(envelope.Violation{Field: "tenant", Reason: "a provider account belongs to a tenant: name one"})
			}
			// The control plane calls the endpoint with the tenant's
			// credentials: pointing it elsewhere than the service's own
			// API is the platform's decision, so a tenant cannot make the
			// control plane reach into its own network.
			if msg.GetEndpoint() != "" && tx.Caller().Principal.TenantID != "" {
				return nil, &envelope.Error{Code: envelope.CodePermissionDenied,
					Message:    "only a platform admin sets a provider account's endpoint",
					Violations: []envelope.Violation{{Field: "endpoint", Reason: "set by a platform admin only"}}}
			}
			var vs envelope.Violations
			for _, k := range slices.Sorted(maps.Keys(msg.GetSecretRefs())) {
				ref := msg.GetSecretRefs()[k]
				name, _ := secrets.ParseRef(ref)
				if _, err := secrets.Get(ctx, tx, sc.ID(), name, ""); errors.Is(err, store.ErrNotFound) {
					vs.Add("secret_refs."+k, "names no secret of tenant %s: put it first (secrets put %s)", sc.Name(), name)
				} else if err != nil {
					return nil, err
				}
			}
			if err := vs.Err(); err != nil {
				return nil, err
			}
			now := tx.Now()
			a := Account{ID: envelope.NewID(IDPrefix, now), TenantID: sc.ID(), Name: msg.GetName(), Type: msg.GetType(),
				Settings: msg.GetSettings(), SecretRefs: msg.GetSecretRefs(), Endpoint: msg.GetEndpoint(),
				CreatedBy: tx.Caller().Principal.ID, CreateTime: now}
			if err := Insert(ctx, tx, &a); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "a provider account named %q already exists in %s", a.Name, sc.Name())
				}
				return nil, err
			}
			tx.SetResource(a.ID, "")
			tx.Emit(envelope.Event{Type: "provider_account.created", TenantID: a.TenantID, ResourceType: "ProviderAccount", ResourceID: a.ID,
				Data: map[string]any{"name": a.Name, "type": a.Type}})
			return &apiv1.CreateProviderAccountResponse{Account: Proto(a)}, nil
		},
	})
}

func fieldSecret(m providers.Manifest, name string) bool {
	for _, f := range m.Fields {
		if f.Name == name {
			return f.Secret
		}
	}
	return false
}

// Get reads an account.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetProviderAccountRequest]) (*connect.Response[apiv1.GetProviderAccountResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	vs.Ref("account", msg.GetAccount(), IDPrefix)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var t target
	if err := s.env.Resolve(ctx, "provider account", func(ctx context.Context, q store.Querier) (err error) {
		t, err = lookup(ctx, q, msg.GetTenant(), msg.GetAccount())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, t.resource()); err != nil {
		return nil, err
	}
	if err := t.sc.NotFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if !t.found {
		return nil, s.env.Fail(ctx, envelope.NotFound("provider account", msg.GetAccount()))
	}
	return connect.NewResponse(&apiv1.GetProviderAccountResponse{Account: Proto(t.a)}), nil
}

// List lists the tenant's accounts.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListProviderAccountsRequest]) (*connect.Response[apiv1.ListProviderAccountsResponse], error) {
	rows, next, err := tenancy.ListPage(ctx, s.env, req.Msg, "providerAccounts",
		func(ctx context.Context, q store.Querier, sc tenancy.Scope, after string, limit int) ([]Account, error) {
			return List(ctx, q, sc.ID(), after, limit)
		}, func(a Account) string { return a.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListProviderAccountsResponse{NextPageToken: next}
	for _, a := range rows {
		out.Accounts = append(out.Accounts, Proto(a))
	}
	return connect.NewResponse(out), nil
}

// Delete removes an account.
func (s *Service) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteProviderAccountRequest]) (*connect.Response[apiv1.DeleteProviderAccountResponse], error) {
	msg := req.Msg
	var t target
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteProviderAccountResponse]{
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("account", msg.GetAccount(), IDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, err = lookup(ctx, q, msg.GetTenant(), msg.GetAccount())
			return t.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteProviderAccountResponse, error) {
			if err := t.sc.NotFound(); err != nil {
				return nil, err
			}
			if !t.found {
				return nil, envelope.NotFound("provider account", msg.GetAccount())
			}
			a, err := Get(ctx, tx, t.a.TenantID, t.a.ID, store.ForUpdate(tx))
			if errors.Is(err, store.ErrNotFound) {
				return nil, envelope.NotFound("provider account", msg.GetAccount())
			}
			if err != nil {
				return nil, err
			}
			if err := Delete(ctx, tx, a.ID); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "provider_account.deleted", TenantID: a.TenantID, ResourceType: "ProviderAccount", ResourceID: a.ID,
				Data: map[string]any{"name": a.Name, "type": a.Type}})
			return &apiv1.DeleteProviderAccountResponse{}, nil
		},
	})
}

// ListTypes lists the registered provider types and their manifests; it
// names nothing of any tenant, so every authenticated caller may read it.
func (s *Service) ListTypes(ctx context.Context, req *connect.Request[apiv1.ListProviderTypesRequest]) (*connect.Response[apiv1.ListProviderTypesResponse], error) {
	// Decided on the caller's own tenant (the platform for a platform
	// admin): the catalog is the same for everyone who may read there.
	res := iam.Resource{Type: "Platform", ID: iam.PlatformID}
	if c, ok := envelope.CallerFrom(ctx); ok && c.Principal.TenantID != "" {
		res = iam.Resource{Type: "Tenant", ID: c.Principal.TenantID, TenantID: c.Principal.TenantID}
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	out := &apiv1.ListProviderTypesResponse{}
	for _, typ := range providers.Types() {
		f, _ := providers.Lookup(typ)
		pt := &apiv1.ProviderType{Type: typ, Description: f.Manifest.Description}
		for _, fd := range f.Manifest.Fields {
			pt.Fields = append(pt.Fields, &apiv1.ProviderField{Name: fd.Name, Description: fd.Description, Required: fd.Required, Secret: fd.Secret})
		}
		out.Types = append(out.Types, pt)
	}
	return connect.NewResponse(out), nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Credentials opens an account's secret references (in-process, for the
// control plane's calls to the provider); the values never leave it.
func Credentials(ctx context.Context, q store.Querier, sealer secrets.Sealer, a Account) (map[string]string, error) {
	out := make(map[string]string, len(a.SecretRefs))
	for k, ref := range a.SecretRefs {
		v, err := secrets.Open(ctx, q, sealer, a.TenantID, ref)
		if err != nil {
			return nil, fmt.Errorf("provider account %s: credential %s: %w", a.Name, k, err)
		}
		out[k] = string(v.Bytes)
	}
	return out, nil
}
