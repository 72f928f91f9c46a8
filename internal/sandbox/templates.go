package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
	"github.com/better-compute/better-compute/internal/vmcmd"
	"github.com/better-compute/better-compute/internal/vps"
)

// Template limits and defaults.
const (
	DefaultTTL    = time.Hour
	DefaultMaxTTL = 24 * time.Hour
	MaxTTL        = 30 * 24 * time.Hour
	MaxWarm       = 64
	MaxEnv        = 64
)

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// TemplateService serves SandboxTemplateService.
type TemplateService struct{ s *Service }

var _ apiv1connect.SandboxTemplateServiceHandler = (*TemplateService)(nil)

// TemplateResource projects a template into the authorization model.
func TemplateResource(t Template) iam.Resource {
	return iam.Resource{Type: "SandboxTemplate", ID: t.ID, TenantID: t.TenantID, Attrs: map[string]any{
		"name": t.Name, "flavor": t.FlavorName, "warmMax": int64(t.WarmMax), "maxTtlSeconds": int64(t.MaxTTL / time.Second)}}
}

// TemplateProto converts a template for the API (env holds references,
// never values).
func TemplateProto(t Template) *apiv1.SandboxTemplate {
	return &apiv1.SandboxTemplate{Id: t.ID, TenantId: t.TenantID, Name: t.Name, Image: t.Image, Flavor: t.FlavorName, FlavorId: t.FlavorID,
		PoolId: t.PoolID, IpPoolId: t.IPPoolID, DefaultTtl: durationpb.New(t.DefaultTTL), MaxTtl: durationpb.New(t.MaxTTL),
		WarmMin: t.WarmMin, WarmMax: t.WarmMax, Env: t.Env, NetworkPolicy: t.NetworkPolicy, Shape: t.Shape, State: t.State,
		CreateTime: timestamppb.New(t.CreateTime), ProjectId: t.ProjectID}
}

func durationOr(d *durationpb.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.AsDuration()
}

func validateCreateTemplate(vs *envelope.Violations, msg *apiv1.CreateSandboxTemplateRequest) {
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	vs.Name("name", msg.GetName())
	vs.Ref("flavor", msg.GetFlavor(), vps.FlavorIDPrefix)
	if msg.GetProject() != "" {
		vs.Ref("project", msg.GetProject(), "prj")
	}
	if msg.GetIpPool() != "" {
		vs.Ref("ip_pool", msg.GetIpPool(), vps.IPPoolIDPrefix)
	}
	def, mx := durationOr(msg.GetDefaultTtl(), DefaultTTL), durationOr(msg.GetMaxTtl(), max(DefaultMaxTTL, durationOr(msg.GetDefaultTtl(), 0)))
	switch {
	case def <= 0 || def%time.Second != 0:
		vs.Add("default_ttl", "must be a positive whole number of seconds, got %s", def)
	case mx > MaxTTL:
		vs.Add("max_ttl", "must be at most %s, got %s", MaxTTL, mx)
	case mx < def || mx%time.Second != 0:
		vs.Add("max_ttl", "must be whole seconds and at least default_ttl (%s), got %s", def, mx)
	}
	if msg.GetWarmMin() < 0 || msg.GetWarmMax() < 0 || msg.GetWarmMax() > MaxWarm {
		vs.Add("warm_max", "warm sizes must be between 0 and %d, got min %d max %d", MaxWarm, msg.GetWarmMin(), msg.GetWarmMax())
	} else if msg.GetWarmMin() > msg.GetWarmMax() {
		vs.Add("warm_min", "must not exceed warm_max (%d), got %d", msg.GetWarmMax(), msg.GetWarmMin())
	}
	if len(msg.GetEnv()) > MaxEnv {
		vs.Add("env", "at most %d variables, got %d", MaxEnv, len(msg.GetEnv()))
	}
	for _, k := range sortedKeys(msg.GetEnv()) {
		field := "env." + k
		if !envNameRE.MatchString(k) {
			vs.Add("env", "%q is not an environment variable name", truncate(k))
			continue
		}
		if _, ok := secrets.ParseRef(msg.GetEnv()[k]); !ok {
			vs.Add(field, "must be secret://<name> of one of the tenant's secrets, got %q", truncate(msg.GetEnv()[k]))
		}
	}
	if p := msg.GetNetworkPolicy(); p != "" && p != vmcmd.PolicyEgress && p != vmcmd.PolicyPrivate && p != vmcmd.PolicyNone {
		vs.Add("network_policy", "must be egress, private or none, got %q", truncate(p))
	}
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// bootRequest is the instance create a template makes.
func bootRequest(tenant, name string, t Template) *apiv1.CreateInstanceRequest {
	return &apiv1.CreateInstanceRequest{Tenant: tenant, Name: name, Flavor: t.FlavorID, Image: t.Image, Pool: t.PoolID,
		IpPool: t.IPPoolID, NetworkPolicy: t.NetworkPolicy, Project: t.ProjectID}
}

// shapeOf fingerprints what a warm instance is booted from, plus the
// template's id: a new template is a new shape.
func shapeOf(t Template) string {
	b, _ := json.Marshal([]any{t.ID, t.Image, t.FlavorID, t.PoolID, t.IPPoolID, t.Env, t.NetworkPolicy})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// Create checks a template once against its pool and records it.
func (ts *TemplateService) Create(ctx context.Context, req *connect.Request[apiv1.CreateSandboxTemplateRequest]) (*connect.Response[apiv1.CreateSandboxTemplateResponse], error) {
	s, msg := ts.s, req.Msg
	var (
		sc   tenancy.Scope
		boot *vps.Boot
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateSandboxTemplateResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			validateCreateTemplate(&vs, msg)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant()); err != nil || !sc.Found {
				return iam.Resource{Type: "SandboxTemplate", ID: iam.DraftID}, err
			}
			if boot, err = s.inst.ResolveBoot(ctx, q, &apiv1.CreateInstanceRequest{Tenant: msg.GetTenant(), Name: "template-check",
				Flavor: msg.GetFlavor(), Image: msg.GetImage(), Pool: msg.GetPool(), IpPool: msg.GetIpPool(),
				NetworkPolicy: msg.GetNetworkPolicy(), Project: msg.GetProject()}); err != nil {
				return iam.Resource{}, err
			}
			return iam.Resource{Type: "SandboxTemplate", ID: iam.DraftID, TenantID: sc.ID(), Attrs: map[string]any{
				"name": msg.GetName(), "flavor": msg.GetFlavor(), "warmMax": int64(msg.GetWarmMax()),
				"maxTtlSeconds": int64(durationOr(msg.GetMaxTtl(), DefaultMaxTTL) / time.Second)}}, nil
		},
		Submit: func(ctx context.Context, write func(ctx context.Context, b *envelope.Batch) error) error {
			if boot == nil || !boot.Placeable() {
				return s.env.CommitAlone(ctx, write)
			}
			return s.inst.Submit(ctx, boot.PoolID(), sc.ID(), write)
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateSandboxTemplateResponse, error) {
			if err := sc.NotFound(); err != nil {
				return nil, err
			}
			if sc.Platform {
				return nil, envelope.Invalid(envelope.Violation{Field: "tenant", Reason: "sandbox templates belong to a tenant: name one"})
			}
			image, err := boot.Check(s.inst)
			if err != nil {
				return nil, err
			}
			// Only the tenant's own secrets: a platform secret or another
			// tenant's is not found under this tenant.
			for _, k := range sortedKeys(msg.GetEnv()) {
				name, _ := secrets.ParseRef(msg.GetEnv()[k])
				if _, err := secrets.Get(ctx, tx, sc.ID(), name, ""); errors.Is(err, store.ErrNotFound) {
					return nil, envelope.Invalid(envelope.Violation{Field: "env." + k,
						Reason: fmt.Sprintf("names no secret of tenant %s (only the tenant's own secrets can be used)", sc.Name())})
				} else if err != nil {
					return nil, err
				}
			}
			if err := s.inst.CheckFits(ctx, boot); err != nil {
				return nil, err
			}
			if _, err := TemplateGet(ctx, tx, sc.ID(), msg.GetName()); err == nil {
				return nil, envelope.Errorf(envelope.CodeAlreadyExists, "a sandbox template named %q already exists in %s", msg.GetName(), sc.Name())
			} else if !errors.Is(err, store.ErrNotFound) {
				return nil, err
			}
			now := tx.Now()
			def := durationOr(msg.GetDefaultTtl(), DefaultTTL)
			t := Template{ID: envelope.NewID(TemplateIDPrefix, now), TenantID: sc.ID(), Name: msg.GetName(), Image: image,
				FlavorID: boot.FlavorID(), FlavorName: boot.FlavorName(), PoolID: boot.PoolID(), IPPoolID: boot.IPPoolID(),
				DefaultTTL: def, MaxTTL: durationOr(msg.GetMaxTtl(), max(DefaultMaxTTL, def)), WarmMin: msg.GetWarmMin(), WarmMax: msg.GetWarmMax(),
				Env: msg.GetEnv(), NetworkPolicy: cmpOr(msg.GetNetworkPolicy(), vmcmd.PolicyEgress), State: TemplateActive,
				CreatedBy: tx.Caller().Principal.ID, CreateTime: now, UpdateTime: now, ProjectID: boot.ProjectID()}
			if t.Env == nil {
				t.Env = map[string]string{}
			}
			t.Shape = shapeOf(t)
			if err := TemplateInsert(ctx, tx.Tx, &t); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "a sandbox template named %q already exists in %s", t.Name, sc.Name())
				}
				return nil, err
			}
			tx.SetResource(t.ID, "")
			tx.Emit(envelope.Event{Type: "sandbox_template.created", TenantID: t.TenantID, ResourceType: "SandboxTemplate", ResourceID: t.ID,
				Data: map[string]any{"name": t.Name, "flavor": t.FlavorName, "shape": t.Shape, "warm_min": t.WarmMin, "warm_max": t.WarmMax}})
			return &apiv1.CreateSandboxTemplateResponse{Template: TemplateProto(t)}, nil
		},
	})
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// templateRef is a template resolved before a decision.
type templateRef = tenancy.Item[Template]

var templateKind = tenancy.ItemKind[Template]{Type: "SandboxTemplate", Noun: "sandbox template", Resource: TemplateResource, Get: TemplateGet}

func lookupTemplate(ctx context.Context, q store.Querier, tenantRef, ref string) (templateRef, error) {
	return templateKind.Lookup(ctx, q, tenantRef, ref)
}

func validateTemplateRef(vs *envelope.Violations, tenant, ref string) {
	vs.Ref("tenant", tenant, "tnt")
	vs.Ref("template", ref, TemplateIDPrefix)
}

// Get reads a template.
func (ts *TemplateService) Get(ctx context.Context, req *connect.Request[apiv1.GetSandboxTemplateRequest]) (*connect.Response[apiv1.GetSandboxTemplateResponse], error) {
	s, msg := ts.s, req.Msg
	var vs envelope.Violations
	validateTemplateRef(&vs, msg.GetTenant(), msg.GetTemplate())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var r templateRef
	if err := s.env.Resolve(ctx, "sandbox template", func(ctx context.Context, q store.Querier) (err error) {
		r, err = lookupTemplate(ctx, q, msg.GetTenant(), msg.GetTemplate())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.Resource()); err != nil {
		return nil, err
	}
	if err := r.NotFound(msg.GetTemplate()); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetSandboxTemplateResponse{Template: TemplateProto(r.Obj)}), nil
}

// List lists a tenant's templates.
func (ts *TemplateService) List(ctx context.Context, req *connect.Request[apiv1.ListSandboxTemplatesRequest]) (*connect.Response[apiv1.ListSandboxTemplatesResponse], error) {
	ts2, next, err := tenancy.ListPage(ctx, ts.s.env, req.Msg, "sandbox templates",
		func(ctx context.Context, q store.Querier, sc tenancy.Scope, after string, limit int) ([]Template, error) {
			return TemplateList(ctx, q, sc.ID(), after, limit)
		}, func(t Template) string { return t.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListSandboxTemplatesResponse{NextPageToken: next}
	for _, t := range ts2 {
		out.Templates = append(out.Templates, TemplateProto(t))
	}
	return connect.NewResponse(out), nil
}

// Delete retires a template: it stops holding its name at once, and the
// warm pool reconciler drains its warm instances, then removes it.
func (ts *TemplateService) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteSandboxTemplateRequest]) (*connect.Response[apiv1.DeleteSandboxTemplateResponse], error) {
	s, msg := ts.s, req.Msg
	var r templateRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteSandboxTemplateResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateTemplateRef(&vs, msg.GetTenant(), msg.GetTemplate())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupTemplate(ctx, q, msg.GetTenant(), msg.GetTemplate())
			return r.Resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteSandboxTemplateResponse, error) {
			if err := r.NotFound(msg.GetTemplate()); err != nil {
				return nil, err
			}
			now := tx.Now()
			if err := TemplateSetState(ctx, tx.Tx, r.Obj.ID, TemplateDeleting, now); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "sandbox_template.deleted", TenantID: r.Obj.TenantID, ResourceType: "SandboxTemplate",
				ResourceID: r.Obj.ID, Data: map[string]any{"name": r.Obj.Name}})
			return &apiv1.DeleteSandboxTemplateResponse{}, nil
		},
	})
}
