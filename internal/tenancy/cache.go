package tenancy

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/dirversion"
)

// Names of the directory caches, for dirversion's statistics.
const (
	TenantCacheName  = "tenancy.tenants"
	ProjectCacheName = "tenancy.projects"
)

// tenants caches tenants by the reference a request gave (a name or an
// id); projects caches a tenant's projects by tenant id and reference, so
// one tenant's reference never finds another's project. Both hold only rows
// that exist, at the request's directory version: TenantInsert,
// ProjectInsert and ProjectDelete move it on.
var (
	tenants  = dirversion.NewCache[string, Tenant](TenantCacheName, 10000)
	projects = dirversion.NewCache[projectKey, Project](ProjectCacheName, 10000)
)

type projectKey struct{ tenantID, ref string }

// CachedTenant is LookupTenant answered from the directory cache at the
// request's directory version when it can be (see store/dirversion). Use it
// to resolve a request before its decision, not inside a write transaction:
// what a mutation relies on it reads again under its own transaction.
func CachedTenant(ctx context.Context, q store.Querier, ref string) (Tenant, bool, error) {
	if t, ok := tenants.Get(ctx, ref); ok {
		return t, true, nil
	}
	t, found, err := LookupTenant(ctx, q, ref)
	if found {
		tenants.Put(ctx, ref, t)
	}
	return t, found, err
}

// CachedProject is ProjectGet answered from the directory cache, as
// CachedTenant: a miss is store.ErrNotFound, read afresh every time.
func CachedProject(ctx context.Context, q store.Querier, tenantID, ref string) (Project, error) {
	key := projectKey{tenantID: tenantID, ref: ref}
	if p, ok := projects.Get(ctx, key); ok {
		return p, nil
	}
	p, err := ProjectGet(ctx, q, tenantID, ref)
	if err == nil {
		projects.Put(ctx, key, p)
	}
	return p, err
}
