package metal

import (
	"context"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// scope is the owner a request names: a tenant, or the platform (the
// operator's own sites and machines).
type scope struct {
	ref      string
	platform bool
	tenant   tenancy.Tenant
	found    bool
}

// lookupScope resolves a request's tenant field. Empty means the caller's
// own tenant for a tenant principal and the platform for a platform one.
func lookupScope(ctx context.Context, q store.Querier, ref string) (scope, error) {
	s := scope{ref: ref}
	if ref == "" {
		c, _ := envelope.CallerFrom(ctx)
		if c.Principal.TenantID == "" {
			s.platform, s.found = true, true
			return s, nil
		}
		ref = c.Principal.TenantID
	}
	var err error
	s.tenant, s.found, err = tenancy.LookupTenant(ctx, q, ref)
	return s, err
}

// id is the owner's tenant id (” for the platform).
func (s scope) id() string { return s.tenant.ID }

// resource is the container a list, or a miss, is decided on. A tenant
// that does not exist decides as the platform, so a stranger learns
// nothing.
func (s scope) resource() iam.Resource {
	if s.platform {
		return tenancy.PlatformResource()
	}
	return tenancy.TenantResource(s.tenant)
}

func (s scope) notFound() error {
	if !s.found {
		return envelope.NotFound("tenant", s.ref)
	}
	return nil
}

// missing is the resource a decision is made on when the named resource
// does not exist: the scope's tenant, or the platform.
func (s scope) missing(typ string) iam.Resource {
	if s.found && !s.platform {
		return iam.Resource{Type: typ, ID: envelope.UnknownResourceID, TenantID: s.id()}
	}
	return iam.Resource{Type: typ, ID: envelope.UnknownResourceID}
}

func validateScope(vs *envelope.Violations, tenant string) {
	if tenant != "" {
		vs.Ref("tenant", tenant, "tnt")
	}
}
