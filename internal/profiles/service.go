package profiles

import (
	"context"
	"encoding/json"
	"errors"
	"sort"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// ServiceConfig wires the service to the modules that use profiles.
type ServiceConfig struct {
	// Catalog is what documents are checked against (the machine engine's
	// step kinds and the driver operations).
	Catalog func() Catalog
	// NamedBy returns a machine of the tenant whose hardware profile is
	// name ("" none): such a profile cannot be deleted.
	NamedBy func(ctx context.Context, q store.Querier, tenantID, name string) (string, error)
}

// Service serves ProfileService.
type Service struct {
	env *envelope.Envelope
	cfg ServiceConfig
}

// NewService returns the handlers.
func NewService(env *envelope.Envelope, cfg ServiceConfig) *Service {
	return &Service{env: env, cfg: cfg}
}

var _ apiv1connect.ProfileServiceHandler = (*Service)(nil)

// Resource projects a tenant's profile into the authorization model.
func Resource(s Stored) iam.Resource {
	return iam.Resource{Type: "Profile", ID: s.ID, TenantID: s.TenantID, Attrs: map[string]any{"name": s.Name, "kind": s.Kind}}
}

// Proto is the API's view of a profile.
func Proto(s Stored) *apiv1.Profile {
	p := &apiv1.Profile{Id: s.ID, TenantId: s.TenantID, Name: s.Name, Kind: s.Kind, Description: s.Description,
		Version: int32(s.Version), Document: s.Document, Format: s.Format, Builtin: s.Builtin, Driver: s.Driver,
		CreatedBy: s.CreatedBy}
	if !s.CreateTime.IsZero() {
		p.CreateTime, p.UpdateTime = timestamppb.New(s.CreateTime), timestamppb.New(s.UpdateTime)
	}
	for _, st := range s.Expansion.Steps {
		p.Steps = append(p.Steps, protoStep(st))
	}
	for _, st := range s.Expansion.Cleanup {
		p.Cleanup = append(p.Cleanup, protoStep(st))
	}
	return p
}

func protoStep(s provision.Step) *apiv1.ProfileStep {
	params := ""
	if len(s.Params) > 0 {
		b, _ := json.Marshal(s.Params) // validated to encode
		params = string(b)
	}
	return &apiv1.ProfileStep{Name: s.Name, Kind: s.Kind, Destructive: s.Destructive, ParamsJson: params,
		TimeoutSeconds: int64(s.Timeout.Seconds()), Retries: int32(s.Retries), BackoffSeconds: int64(s.Backoff.Seconds()),
		OnFailure: s.OnFailure, When: s.When, Acceptance: s.Acceptance, FallbackFor: s.FallbackFor}
}

func (s *Service) catalog() Catalog {
	if s.cfg.Catalog == nil {
		return Catalog{Kinds: []string{}}
	}
	return s.cfg.Catalog()
}

// parse checks a request's document: violations name the document's
// fields, under no prefix (the document is the request's body).
func (s *Service) parse(text, format string) (Document, error) {
	return Parse([]byte(text), format, s.catalog())
}

type target struct {
	sc      tenancy.Scope
	p       Stored
	found   bool
	builtin bool
}

// resource is what a decision is made on: the tenant's profile, or, for a
// built-in or a miss, the scope (a built-in is everyone's to read).
func (t target) resource() iam.Resource {
	switch {
	case t.found && !t.builtin:
		return Resource(t.p)
	case t.builtin:
		return t.sc.Resource()
	}
	return t.sc.Missing("Profile")
}

func lookup(ctx context.Context, q store.Querier, tenantRef, ref string, builtins bool) (target, error) {
	var t target
	var err error
	if t.sc, err = tenancy.LookupScope(ctx, q, tenantRef); err != nil || !t.sc.Found {
		return t, err
	}
	if builtins {
		for _, b := range BuiltinStored() {
			if b.Name == ref || b.ID == ref {
				t.p, t.found, t.builtin = b, true, true
				return t, nil
			}
		}
	}
	if t.sc.Platform {
		return t, nil
	}
	t.p, err = Get(ctx, q, t.sc.ID(), ref, "")
	switch {
	case errors.Is(err, store.ErrNotFound):
		return t, nil
	case err != nil:
		return t, err
	}
	t.found = true
	return t, nil
}

func validateRef(vs *envelope.Violations, tenant, ref string) {
	tenancy.ValidateScope(vs, tenant)
	switch {
	case ref == "":
		vs.Add("profile", "is required: a profile's name or id")
	case len(ref) > 100:
		vs.Add("profile", "must be at most 100 bytes")
	}
}

// Create stores a tenant's profile.
func (s *Service) Create(ctx context.Context, req *connect.Request[apiv1.CreateProfileRequest]) (*connect.Response[apiv1.CreateProfileResponse], error) {
	msg := req.Msg
	var sc tenancy.Scope
	var doc Document
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateProfileResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			if err := vs.Err(); err != nil {
				return err
			}
			var err error
			doc, err = s.parse(msg.GetDocument(), msg.GetFormat())
			return err
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant()); err != nil || !sc.Found {
				return iam.Resource{Type: "Profile", ID: iam.DraftID}, err
			}
			return iam.Resource{Type: "Profile", ID: iam.DraftID, TenantID: sc.ID(),
				Attrs: map[string]any{"name": doc.Name, "kind": doc.Kind}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateProfileResponse, error) {
			if err := sc.NotFound(); err != nil {
				return nil, err
			}
			if sc.Platform {
				return nil, envelope.Invalid(envelope.Violation{Field: "tenant", Reason: "a profile belongs to a tenant: name one (the built-in profiles are the platform's)"})
			}
			if _, ok := Builtin(doc.Name); ok {
				return nil, envelope.Errorf(envelope.CodeAlreadyExists, "%q is a built-in profile: give yours another metadata.name", doc.Name)
			}
			now := tx.Now()
			p := FromDocument(doc, msg.GetDocument(), msg.GetFormat())
			p.ID, p.TenantID, p.Version, p.CreatedBy, p.CreateTime, p.UpdateTime = envelope.NewID(IDPrefix, now), sc.ID(), 1,
				tx.Caller().Principal.ID, now, now
			if err := Insert(ctx, tx, &p); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "a profile named %q already exists in %s: update it", p.Name, sc.Name())
				}
				return nil, err
			}
			tx.SetResource(p.ID, "")
			tx.Emit(envelope.Event{Type: "profile.created", TenantID: p.TenantID, ResourceType: "Profile", ResourceID: p.ID,
				Data: map[string]any{"name": p.Name, "kind": p.Kind, "version": p.Version}})
			return &apiv1.CreateProfileResponse{Profile: Proto(p)}, nil
		},
	})
}

// Get reads a profile: the tenant's own or a built-in.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetProfileRequest]) (*connect.Response[apiv1.GetProfileResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateRef(&vs, msg.GetTenant(), msg.GetProfile())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var t target
	if err := s.env.Resolve(ctx, "profile", func(ctx context.Context, q store.Querier) (err error) {
		t, err = lookup(ctx, q, msg.GetTenant(), msg.GetProfile(), true)
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
		return nil, s.env.Fail(ctx, envelope.NotFound("profile", msg.GetProfile()))
	}
	return connect.NewResponse(&apiv1.GetProfileResponse{Profile: Proto(t.p)}), nil
}

// List lists the built-in profiles, then the tenant's, by id.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListProfilesRequest]) (*connect.Response[apiv1.ListProfilesResponse], error) {
	rows, next, err := tenancy.ListPage(ctx, s.env, req.Msg, "profiles",
		func(ctx context.Context, q store.Querier, sc tenancy.Scope, after string, limit int) ([]Stored, error) {
			var out []Stored
			bs := BuiltinStored()
			sort.Slice(bs, func(i, j int) bool { return bs[i].ID < bs[j].ID })
			for _, b := range bs {
				if b.ID > after && len(out) < limit {
					out = append(out, b)
				}
			}
			if sc.Platform || len(out) >= limit {
				return out, nil
			}
			own, err := List(ctx, q, sc.ID(), after, limit-len(out))
			return append(out, own...), err
		}, func(p Stored) string { return p.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListProfilesResponse{NextPageToken: next}
	for _, p := range rows {
		out.Profiles = append(out.Profiles, Proto(p))
	}
	return connect.NewResponse(out), nil
}

// Update replaces a tenant's profile with a new version.
func (s *Service) Update(ctx context.Context, req *connect.Request[apiv1.UpdateProfileRequest]) (*connect.Response[apiv1.UpdateProfileResponse], error) {
	msg := req.Msg
	var t target
	var doc Document
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.UpdateProfileResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			validateRef(&vs, msg.GetTenant(), msg.GetProfile())
			if err := vs.Err(); err != nil {
				return err
			}
			var err error
			doc, err = s.parse(msg.GetDocument(), msg.GetFormat())
			return err
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, err = lookup(ctx, q, msg.GetTenant(), msg.GetProfile(), false)
			return t.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.UpdateProfileResponse, error) {
			if err := t.sc.NotFound(); err != nil {
				return nil, err
			}
			if !t.found {
				if _, ok := Builtin(msg.GetProfile()); ok {
					return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "%q is a built-in profile: it changes with the release; create your own under another name", msg.GetProfile())
				}
				return nil, envelope.NotFound("profile", msg.GetProfile())
			}
			p, err := Get(ctx, tx, t.p.TenantID, t.p.ID, store.ForUpdate(tx))
			if errors.Is(err, store.ErrNotFound) {
				return nil, envelope.NotFound("profile", msg.GetProfile())
			}
			if err != nil {
				return nil, err
			}
			var vs envelope.Violations
			if doc.Name != p.Name {
				vs.Add("metadata.name", "must stay %q (a profile is renamed by creating another), got %q", p.Name, doc.Name)
			}
			if doc.Kind != p.Kind {
				vs.Add("kind", "must stay %s, got %s", p.Kind, doc.Kind)
			}
			if err := vs.Err(); err != nil {
				return nil, err
			}
			next := FromDocument(doc, msg.GetDocument(), msg.GetFormat())
			next.ID, next.TenantID, next.Version, next.CreatedBy, next.CreateTime, next.UpdateTime = p.ID, p.TenantID, p.Version+1,
				p.CreatedBy, p.CreateTime, tx.Now()
			if err := Update(ctx, tx, &next); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "profile.updated", TenantID: p.TenantID, ResourceType: "Profile", ResourceID: p.ID,
				Data: map[string]any{"name": p.Name, "kind": p.Kind, "version": next.Version}})
			return &apiv1.UpdateProfileResponse{Profile: Proto(next)}, nil
		},
	})
}

// Delete removes a tenant's profile.
func (s *Service) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteProfileRequest]) (*connect.Response[apiv1.DeleteProfileResponse], error) {
	msg := req.Msg
	var t target
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteProfileResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			validateRef(&vs, msg.GetTenant(), msg.GetProfile())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, err = lookup(ctx, q, msg.GetTenant(), msg.GetProfile(), false)
			return t.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteProfileResponse, error) {
			if err := t.sc.NotFound(); err != nil {
				return nil, err
			}
			if !t.found {
				if _, ok := Builtin(msg.GetProfile()); ok {
					return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "%q is a built-in profile: it ships with the release", msg.GetProfile())
				}
				return nil, envelope.NotFound("profile", msg.GetProfile())
			}
			p, err := Get(ctx, tx, t.p.TenantID, t.p.ID, store.ForUpdate(tx))
			if errors.Is(err, store.ErrNotFound) {
				return nil, envelope.NotFound("profile", msg.GetProfile())
			}
			if err != nil {
				return nil, err
			}
			if s.cfg.NamedBy != nil {
				m, err := s.cfg.NamedBy(ctx, tx, p.TenantID, p.Name)
				if err != nil {
					return nil, err
				}
				if m != "" {
					return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
						"profile %s is the hardware profile of machine %s: give the machine another before deleting it", p.Name, m)
				}
			}
			if err := Delete(ctx, tx, p.ID); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "profile.deleted", TenantID: p.TenantID, ResourceType: "Profile", ResourceID: p.ID,
				Data: map[string]any{"name": p.Name, "kind": p.Kind}})
			return &apiv1.DeleteProfileResponse{}, nil
		},
	})
}

// Validate checks a document and returns its expansion, storing nothing.
func (s *Service) Validate(ctx context.Context, req *connect.Request[apiv1.ValidateProfileRequest]) (*connect.Response[apiv1.ValidateProfileResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var sc tenancy.Scope
	if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, sc.Resource()); err != nil {
		return nil, err
	}
	if err := sc.NotFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	doc, err := s.parse(msg.GetDocument(), msg.GetFormat())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	p := FromDocument(doc, msg.GetDocument(), msg.GetFormat())
	p.TenantID = sc.ID()
	return connect.NewResponse(&apiv1.ValidateProfileResponse{Profile: Proto(p)}), nil
}
