package workloadid

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"

	"connectrpc.com/connect"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/sandbox"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
	"github.com/better-compute/better-compute/internal/vps"
)

// Token lifetimes.
const (
	DefaultTTL = 15 * time.Minute
	MinTTL     = time.Minute
	MaxTTL     = time.Hour
)

// Workload kinds.
const (
	KindReservation = "reservation"
	KindInstance    = "instance"
	KindSandbox     = "sandbox"
)

// Well-known paths, served unauthenticated.
const (
	JWKSPath      = "/.well-known/jwks.json"
	DiscoveryPath = "/.well-known/openid-configuration"
)

// MaxAudience bounds the aud a request asks for.
const MaxAudience = 256

// Claims are a workload token's claims beyond the registered ones.
type Claims struct {
	TenantID     string `json:"tenant_id"`
	Tenant       string `json:"tenant"`
	ProjectID    string `json:"project_id,omitempty"`
	Project      string `json:"project,omitempty"`
	WorkloadKind string `json:"workload_kind"`
	WorkloadID   string `json:"workload_id"`
}

// Service serves WorkloadIdentityService and the well-known documents.
type Service struct {
	env    *envelope.Envelope
	keys   *pki.WorkloadKeys
	issuer string
}

var _ apiv1connect.WorkloadIdentityServiceHandler = (*Service)(nil)

// NewService returns the handlers. keys nil (no sealing secret) or an
// empty issuer turn workload identity off: IssueToken fails
// FAILED_PRECONDITION and the well-known documents are 404.
func NewService(env *envelope.Envelope, keys *pki.WorkloadKeys, issuer string) *Service {
	return &Service{env: env, keys: keys, issuer: strings.TrimSuffix(issuer, "/")}
}

func (s *Service) off() bool { return s.keys == nil || s.issuer == "" }

// target is the workload a request names, resolved before the decision.
type target struct {
	kind               string
	scope              tenancy.Scope
	found              bool
	resource           iam.Resource
	id, projectID      string
	end                time.Time
	ended              string // why it cannot have a token, "" when it can
	tenantID, tenantNm string
}

var idPrefix = map[string]string{KindReservation: reservation.IDPrefix, KindInstance: vps.InstanceIDPrefix, KindSandbox: sandbox.SandboxIDPrefix}

var (
	reservationKind = tenancy.ItemKind[reservation.Reservation]{Type: "Reservation", Noun: "reservation", Resource: reservation.Resource,
		Get: reservation.Get}
	instanceKind = tenancy.ItemKind[vps.Instance]{Type: "Instance", Noun: "instance", Resource: vps.InstanceResource,
		Get: func(ctx context.Context, q store.Querier, tenantID, ref string) (vps.Instance, error) {
			return vps.InstanceGet(ctx, q, tenantID, ref, "")
		}}
	sandboxKind = tenancy.ItemKind[sandbox.Sandbox]{Type: "Sandbox", Noun: "sandbox", Resource: sandbox.Resource,
		Get: func(ctx context.Context, q store.Querier, tenantID, id string) (sandbox.Sandbox, error) {
			return sandbox.SandboxGet(ctx, q, tenantID, id, "")
		}}
)

// lookup resolves the workload; now decides whether it has ended.
func lookup(ctx context.Context, q store.Querier, tenantRef, kind, ref string, now time.Time) (target, error) {
	t := target{kind: kind}
	switch kind {
	case KindReservation:
		it, err := reservationKind.Lookup(ctx, q, tenantRef, ref)
		if err != nil {
			return t, err
		}
		t.scope, t.found, t.resource = it.Scope, it.Found, it.Resource()
		r := it.Obj
		t.id, t.projectID, t.end = r.ID, r.ProjectID, r.EndsAt
		if r.State != reservation.StateActive {
			t.ended = fmt.Sprintf("reservation %s is %s; a token needs it active", r.ID, r.State)
		}
	case KindInstance:
		it, err := instanceKind.Lookup(ctx, q, tenantRef, ref)
		if err != nil {
			return t, err
		}
		t.scope, t.found, t.resource = it.Scope, it.Found, it.Resource()
		in := it.Obj
		t.id, t.projectID = in.ID, in.ProjectID
		switch in.State {
		case vps.StateDeleting, vps.StateDeleted, vps.StateFailed, vps.StateLost:
			t.ended = fmt.Sprintf("instance %s is %s", in.ID, in.State)
		}
	case KindSandbox:
		it, err := sandboxKind.Lookup(ctx, q, tenantRef, ref)
		if err != nil {
			return t, err
		}
		t.scope, t.found, t.resource = it.Scope, it.Found, it.Resource()
		sb := it.Obj
		t.id, t.end = sb.ID, sb.ExpireTime
		switch {
		case sb.State != sandbox.SandboxActive:
			t.ended = fmt.Sprintf("sandbox %s is %s", sb.ID, sb.State)
		case !now.Before(sb.ExpireTime):
			t.ended = fmt.Sprintf("sandbox %s expired at %s", sb.ID, sb.ExpireTime.UTC().Format(time.RFC3339))
		}
	}
	if t.scope.Found {
		t.tenantID, t.tenantNm = t.scope.Tenant.ID, t.scope.Tenant.Name
	}
	if t.found && !t.end.IsZero() && t.ended == "" && !now.Before(t.end) {
		t.ended = fmt.Sprintf("%s %s ended at %s", kind, t.id, t.end.UTC().Format(time.RFC3339))
	}
	return t, nil
}

// notFound is the miss after the decision: the tenant or the workload.
func (t target) notFound(ref string) error {
	if err := t.scope.NotFound(); err != nil {
		return err
	}
	if !t.found {
		return envelope.NotFound(t.kind, ref)
	}
	return nil
}

// IssueToken signs a token for one of the tenant's workloads.
func (s *Service) IssueToken(ctx context.Context, req *connect.Request[apiv1.IssueWorkloadTokenRequest]) (*connect.Response[apiv1.IssueWorkloadTokenResponse], error) {
	msg := req.Msg
	ttl := time.Duration(msg.GetTtlSeconds()) * time.Second
	if ttl == 0 {
		ttl = DefaultTTL
	}
	var (
		t      target
		signer pki.WorkloadSigner
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.IssueWorkloadTokenResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			prefix, ok := idPrefix[msg.GetWorkloadKind()]
			if !ok {
				vs.Add("workload_kind", "must be reservation, instance or sandbox, got %q", clip(msg.GetWorkloadKind()))
			} else if msg.GetWorkloadKind() == KindInstance {
				vs.Ref("workload", msg.GetWorkload(), prefix)
			} else {
				vs.ID("workload", msg.GetWorkload(), prefix)
			}
			validAudience(&vs, msg.GetAudience())
			if ttl < MinTTL || ttl > MaxTTL {
				vs.Add("ttl_seconds", "must be 0 (15 minutes) or 60 to 3600, got %d", msg.GetTtlSeconds())
			}
			if err := vs.Err(); err != nil {
				return err
			}
			if s.off() {
				return envelope.Errorf(envelope.CodeFailedPrecondition,
					"workload identity is off: the control plane needs BETTER_COMPUTE_SECRET and --workload-issuer")
			}
			// The first key is written in a transaction of its own, so
			// take the signer before the mutation's.
			var err error
			signer, err = s.keys.Signer(ctx)
			return err
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, err = lookup(ctx, q, msg.GetTenant(), msg.GetWorkloadKind(), msg.GetWorkload(), s.env.Clock().Now())
			return t.resource, err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.IssueWorkloadTokenResponse, error) {
			if err := t.notFound(msg.GetWorkload()); err != nil {
				return nil, err
			}
			now := tx.Now()
			// Re-read: the workload may have ended since the decision.
			cur, err := lookup(ctx, tx.Tx, t.tenantID, t.kind, t.id, now)
			if err != nil {
				return nil, err
			}
			if err := cur.notFound(t.id); err != nil {
				return nil, err
			}
			if cur.ended != "" {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "%s", cur.ended)
			}
			active, err := tenancy.Active(ctx, tx.Tx, cur.tenantID)
			if err != nil {
				return nil, err
			}
			if !active {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "tenant %s may not act (suspended or deleted): no workload tokens", cur.tenantNm)
			}
			c := Claims{TenantID: cur.tenantID, Tenant: cur.tenantNm, ProjectID: cur.projectID, WorkloadKind: cur.kind, WorkloadID: cur.id}
			if cur.projectID != "" {
				p, err := tenancy.ProjectGet(ctx, tx.Tx, cur.tenantID, cur.projectID)
				if err != nil {
					return nil, envelope.FromStore(err, "project")
				}
				c.Project = p.Name
			}
			exp := now.Add(ttl)
			if !cur.end.IsZero() && cur.end.Before(exp) {
				// A token outlives no workload.
				exp = cur.end
			}
			// The JWT carries whole seconds: round down, never past the end.
			exp = exp.Truncate(time.Second)
			jti, err := tokenID()
			if err != nil {
				return nil, err
			}
			reg := jwt.Claims{Issuer: s.issuer, Subject: Subject(c), Audience: jwt.Audience{msg.GetAudience()},
				Expiry: jwt.NewNumericDate(exp), IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), ID: jti}
			tok, err := signer.Sign(reg, c)
			if err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "workload.token_issued", TenantID: cur.tenantID, ResourceType: t.resource.Type, ResourceID: cur.id,
				Time: now, Data: map[string]any{"token_id": jti, "audience": msg.GetAudience(), "subject": reg.Subject,
					"expire_time": exp.UTC().Format(time.RFC3339), "kid": signer.KeyID()}})
			return &apiv1.IssueWorkloadTokenResponse{Token: tok, ExpireTime: timestamppb.New(exp), Issuer: s.issuer,
				Subject: reg.Subject, Audience: msg.GetAudience(), TokenId: jti}, nil
		},
		// The token is a credential: a replay answers without it.
		Replayable: func(res *apiv1.IssueWorkloadTokenResponse) *apiv1.IssueWorkloadTokenResponse {
			out := proto.CloneOf(res)
			out.Token = ""
			return out
		},
	})
}

// Subject is a token's sub: tenant:<name>[:project:<name>]:<kind>:<id>.
func Subject(c Claims) string {
	s := "tenant:" + c.Tenant
	if c.Project != "" {
		s += ":project:" + c.Project
	}
	return s + ":" + c.WorkloadKind + ":" + c.WorkloadID
}

func validAudience(vs *envelope.Violations, aud string) {
	switch {
	case aud == "":
		vs.Add("audience", "is required: the service the token is for")
	case len(aud) > MaxAudience:
		vs.Add("audience", "must be at most %d bytes, got %d", MaxAudience, len(aud))
	case strings.IndexFunc(aud, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0:
		vs.Add("audience", "must have no spaces or control characters, got %q", clip(aud))
	}
}

func tokenID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "wlt_" + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// JWKS serves the published keys. Unauthenticated: a verifier needs no
// account.
func (s *Service) JWKS(w http.ResponseWriter, r *http.Request) {
	if s.off() {
		http.NotFound(w, r)
		return
	}
	set, err := s.keys.JWKS(r.Context())
	if err != nil {
		http.Error(w, "the workload keys cannot be read", http.StatusServiceUnavailable)
		return
	}
	// Short caching: a key made by a rotation signs at once, and a verifier
	// holding an older copy fails on its kid until it fetches again.
	writeJSON(w, set, "public, max-age=60")
}

// Discovery serves the OIDC discovery document of the workload issuer.
func (s *Service) Discovery(w http.ResponseWriter, r *http.Request) {
	if s.off() {
		http.NotFound(w, r)
		return
	}
	writeJSON(w, map[string]any{
		"issuer":                                s.issuer,
		"jwks_uri":                              s.issuer + JWKSPath,
		"response_types_supported":              []string{"id_token"},
		"scopes_supported":                      []string{"openid"},
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": []string{"ES256"},
		"claims_supported": []string{"iss", "sub", "aud", "exp", "iat", "nbf", "jti",
			"tenant_id", "tenant", "project_id", "project", "workload_kind", "workload_id"},
	}, "public, max-age=3600")
}

func writeJSON(w http.ResponseWriter, v any, cache string) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", cache)
	_, _ = w.Write(b)
}
