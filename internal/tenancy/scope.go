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

// PageRequest is a list request of a tenant-or-platform scope.
type PageRequest interface {
	GetTenant() string
	GetPageSize() int32
	GetPageToken() string
}

// ListPage answers a list request of a scope, as every scoped List
// handler does: it validates the scope and the paging, resolves the
// scope, makes the one read decision on it, then reads one row past the
// page with read (given the scope, the cursor and the limit). It returns
// the page and the next page's token ("" on the last page); errors are
// the envelope's, ready to return.
func ListPage[T any](ctx context.Context, env *envelope.Envelope, msg PageRequest, what string,
	read func(ctx context.Context, q store.Querier, sc Scope, after string, limit int) ([]T, error), id func(T) string) ([]T, string, error) {
	var vs envelope.Violations
	ValidateScope(&vs, msg.GetTenant())
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, "", env.Fail(ctx, err)
	}
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), msg.GetTenant())
	if err != nil {
		return nil, "", env.Fail(ctx, err)
	}
	var sc Scope
	if err := env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		sc, err = LookupScope(ctx, q, msg.GetTenant())
		return err
	}); err != nil {
		return nil, "", env.Fail(ctx, err)
	}
	if err := env.AuthorizeRead(ctx, sc.Resource()); err != nil {
		return nil, "", err
	}
	if err := sc.NotFound(); err != nil {
		return nil, "", env.Fail(ctx, err)
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var rows []T
	if err := env.Resolve(ctx, what, func(ctx context.Context, q store.Querier) (err error) {
		rows, err = read(ctx, q, sc, after, limit+1)
		return err
	}); err != nil {
		return nil, "", env.Fail(ctx, err)
	}
	if len(rows) > limit {
		return rows[:limit], envelope.EncodePageToken(id(rows[limit-1]), msg.GetTenant()), nil
	}
	return rows, "", nil
}
