package vps

import (
	"context"
	"errors"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// scope is the owner a request names: a tenant, or the platform.
type scope = tenancy.Scope

// ref is a flavor or IP pool resolved for a draft or a read: its scope, and
// the resource when it exists.
type ref[T any] struct {
	scope
	name  string // as the request named it
	noun  string // in its NOT_FOUND: "flavor", "ip pool"
	typ   string // its Cedar entity type
	obj   T
	found bool
	// own: the resource is the scope's (not a platform one a tenant reads).
	own bool
	res func(T) iam.Resource
}

// lookupRef resolves name in the scope tenantRef names with get; with
// platform set a tenant scope also finds the platform's resource of that
// name (reads of the platform's catalog). A miss is not an error: the
// decision comes first, then notFound.
func lookupRef[T any](ctx context.Context, q store.Querier, tenantRef, name, noun, typ string, platform bool,
	get func(context.Context, store.Querier, string, string) (T, error), res func(T) iam.Resource) (ref[T], error) {
	r := ref[T]{name: name, noun: noun, typ: typ, res: res}
	var err error
	if r.scope, err = tenancy.LookupScope(ctx, q, tenantRef); err != nil || !r.Found {
		return r, err
	}
	owners := []string{r.ID()}
	if platform && !r.Platform {
		owners = append(owners, "")
	}
	for n, owner := range owners {
		r.obj, err = get(ctx, q, owner, name)
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue
		case err != nil:
			return r, err
		}
		r.found, r.own = true, n == 0
		return r, nil
	}
	return r, nil
}

// resource is what a decision is made on: the resource in its owner; a
// platform resource a tenant reads in the reader's tenant; a miss in the
// scope.
func (r ref[T]) resource() iam.Resource {
	switch {
	case r.found && r.own:
		return r.res(r.obj)
	case r.found:
		res := r.res(r.obj)
		res.TenantID = r.ID()
		return res
	default:
		return r.Missing(r.typ)
	}
}

// notFound is the error for a tenant or resource that does not exist,
// after the decision.
func (r ref[T]) notFound() error {
	if err := r.NotFound(); err != nil {
		return err
	}
	if !r.found {
		return envelope.NotFound(r.noun, r.name)
	}
	return nil
}
