package authn

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/dirversion"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// OIDCConfig configures bearer tokens from an external identity provider.
type OIDCConfig struct {
	// Issuer is the provider's issuer URL; empty disables OIDC.
	Issuer string
	// ClientID is the audience tokens must carry.
	ClientID string
	// TenantClaim names the claim holding the user's tenant name (default
	// "bc_tenant"); RoleClaim the role within it (default "bc_role").
	TenantClaim string
	RoleClaim   string
	// PlatformAdmins are subjects ("sub") that are platform administrators.
	PlatformAdmins []string
}

// Authenticator implements envelope.Authenticator.
type Authenticator struct {
	db       *store.DB
	clock    clock.Clock
	oidc     OIDCConfig
	verifier *oidc.IDTokenVerifier
}

// KeyCacheName names the cache of API keys in dirversion's statistics.
const KeyCacheName = "authn.api_keys"

// keys caches active API keys by the hash of their secret, at the request's
// directory version: creating or revoking a key moves the version on
// (KeyInsert, KeyRevoke), so the next request on every replica reads its key
// again. Unknown and revoked keys are not kept; an expiry is checked on
// every hit.
var keys = dirversion.NewCache[string, cachedCaller](KeyCacheName, 10000)

type cachedCaller struct {
	caller envelope.Caller
	keyExp *time.Time
}

// New returns an Authenticator. When cfg.Issuer is set it fetches the
// provider's discovery document, so ctx bounds that.
func New(ctx context.Context, db *store.DB, clk clock.Clock, cfg OIDCConfig) (*Authenticator, error) {
	a := &Authenticator{db: db, clock: cmp.Or[clock.Clock](clk, db.Clock()), oidc: cfg}
	a.oidc.TenantClaim = cmp.Or(cfg.TenantClaim, "bc_tenant")
	a.oidc.RoleClaim = cmp.Or(cfg.RoleClaim, "bc_role")
	if cfg.Issuer != "" {
		if cfg.ClientID == "" {
			return nil, errors.New("authn: oidc client id is required with an issuer")
		}
		p, err := oidc.NewProvider(ctx, cfg.Issuer)
		if err != nil {
			return nil, fmt.Errorf("authn: oidc discovery for %s: %w", cfg.Issuer, err)
		}
		a.verifier = p.Verifier(&oidc.Config{ClientID: cfg.ClientID, Now: a.clock.Now})
	}
	return a, nil
}

func unauthenticated(msg string) error {
	return envelope.Errorf(envelope.CodeUnauthenticated, "%s", msg)
}

// Authenticate implements envelope.Authenticator.
func (a *Authenticator) Authenticate(ctx context.Context, h http.Header) (envelope.Caller, error) {
	auth := h.Get("Authorization")
	if auth == "" {
		return envelope.Caller{}, unauthenticated("missing Authorization: Bearer <api key or OIDC token>")
	}
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || token == "" {
		return envelope.Caller{}, unauthenticated("Authorization must be a Bearer token")
	}
	if strings.HasPrefix(token, secretPrefix) {
		return a.apiKey(ctx, token)
	}
	if a.verifier == nil {
		return envelope.Caller{}, unauthenticated("the token is not an API key and OIDC is not configured")
	}
	return a.oidcToken(ctx, token)
}

func (a *Authenticator) apiKey(ctx context.Context, secret string) (envelope.Caller, error) {
	if len(secret) != len(secretPrefix)+secretLen {
		return envelope.Caller{}, unauthenticated("malformed API key")
	}
	hash := HashSecret(secret)
	now := a.clock.Now()
	if c, hit := keys.Get(ctx, hash); hit && (c.keyExp == nil || now.Before(*c.keyExp)) {
		return c.caller, nil
	}
	var k ApiKey
	err := a.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		k, err = KeyByHash(ctx, tx, hash)
		return err
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return envelope.Caller{}, unauthenticated("unknown API key")
	case err != nil:
		return envelope.Caller{}, envelope.FromStore(err, "api key")
	case k.RevokeTime != nil:
		return envelope.Caller{}, unauthenticated("API key " + k.ID + " was revoked")
	case k.ExpireTime != nil && !now.Before(*k.ExpireTime):
		return envelope.Caller{}, unauthenticated("API key " + k.ID + " has expired")
	}
	caller := envelope.Caller{
		Principal: iam.Principal{
			ID: k.ID, Kind: iam.PrincipalKind(k.Kind), Name: k.Name, TenantID: k.TenantID, Role: iam.Role(k.Role),
		},
		AuthenticatedBy: "api-key",
		CredentialID:    k.ID,
	}
	keys.Put(ctx, hash, cachedCaller{caller: caller, keyExp: k.ExpireTime})
	return caller, nil
}

func (a *Authenticator) oidcToken(ctx context.Context, raw string) (envelope.Caller, error) {
	tok, err := a.verifier.Verify(ctx, raw)
	if err != nil {
		return envelope.Caller{}, unauthenticated("the OIDC token was refused: " + err.Error())
	}
	claims := map[string]any{}
	if err := tok.Claims(&claims); err != nil {
		return envelope.Caller{}, unauthenticated("the OIDC token's claims are unreadable")
	}
	name, _ := claims["email"].(string)
	name = cmp.Or(name, tok.Subject)
	p := iam.Principal{ID: "usr_" + tok.Issuer + "#" + tok.Subject, Kind: iam.KindUser, Name: name}
	for _, admin := range a.oidc.PlatformAdmins {
		if admin == tok.Subject {
			p.Role = iam.RolePlatformAdmin
			return envelope.Caller{Principal: p, AuthenticatedBy: "oidc"}, nil
		}
	}
	tenantName, _ := claims[a.oidc.TenantClaim].(string)
	role, _ := claims[a.oidc.RoleClaim].(string)
	switch iam.Role(role) {
	case iam.RoleAdmin, iam.RoleOperator, iam.RoleMember, iam.RoleViewer:
	default:
		return envelope.Caller{}, unauthenticated(fmt.Sprintf("the OIDC token's %s claim must be admin, operator, member or viewer", a.oidc.RoleClaim))
	}
	if tenantName == "" {
		return envelope.Caller{}, unauthenticated(fmt.Sprintf("the OIDC token has no %s claim", a.oidc.TenantClaim))
	}
	var t tenancy.Tenant
	err = a.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		t, err = tenancy.TenantGet(ctx, tx, tenantName)
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return envelope.Caller{}, unauthenticated("the OIDC token names tenant " + tenantName + ", which does not exist")
	}
	if err != nil {
		return envelope.Caller{}, envelope.FromStore(err, "tenant")
	}
	p.TenantID, p.Role = t.ID, iam.Role(role)
	return envelope.Caller{Principal: p, AuthenticatedBy: "oidc"}, nil
}
