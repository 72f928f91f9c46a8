package tenancy

import (
	"context"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// Scope is the owner a request names: a tenant, or the platform (the
// operator's own images, sites, machines). Services whose resources a
// tenant or the platform may own resolve their tenant field with it.
type Scope struct {
	Ref      string // the tenant as the request named it
	Platform bool
	Tenant   Tenant
	Found    bool
}

// LookupScope resolves a request's tenant field. Empty means the caller's
// own tenant for a tenant principal and the platform for a platform one.
func LookupScope(ctx context.Context, q store.Querier, ref string) (Scope, error) {
	s := Scope{Ref: ref}
	if ref == "" {
		c, _ := envelope.CallerFrom(ctx)
		if c.Principal.TenantID == "" {
			s.Platform, s.Found = true, true
			return s, nil
		}
		ref = c.Principal.TenantID
	}
	var err error
	s.Tenant, s.Found, err = LookupTenant(ctx, q, ref)
	return s, err
}

// ID is the owner's tenant id ("" for the platform).
func (s Scope) ID() string { return s.Tenant.ID }

// Name names the owner in messages.
func (s Scope) Name() string {
	if s.Platform {
		return "the platform"
	}
	return "tenant " + s.Tenant.Name
}

// Resource is the container a list, or a miss, is decided on. A tenant
// that does not exist decides as the platform, so a stranger learns
// nothing.
func (s Scope) Resource() iam.Resource {
	if s.Platform {
		return PlatformResource()
	}
	return TenantResource(s.Tenant)
}

// NotFound is the error for a tenant that does not exist, after the
// decision.
func (s Scope) NotFound() error {
	if !s.Found {
		return envelope.NotFound("tenant", s.Ref)
	}
	return nil
}

// Missing is the resource a decision is made on when the named resource
// of type typ does not exist: the scope's tenant, or the platform.
func (s Scope) Missing(typ string) iam.Resource {
	if s.Found && !s.Platform {
		return iam.Resource{Type: typ, ID: envelope.UnknownResourceID, TenantID: s.ID()}
	}
	return iam.Resource{Type: typ, ID: envelope.UnknownResourceID}
}

// ValidateScope checks a request's tenant field: empty (the caller's own
// scope) or a tenant name or id.
func ValidateScope(vs *envelope.Violations, tenant string) {
	if tenant != "" {
		vs.Ref("tenant", tenant, "tnt")
	}
}
