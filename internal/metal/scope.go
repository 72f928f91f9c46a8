package metal

import (
	"context"
	"errors"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// scope is the owner a request names: a tenant, or the platform (the
// operator's own sites and machines).
type scope = tenancy.Scope

// ref is a site or machine resolved for a draft or a read: its scope, and
// the resource when it exists.
type ref[T any] struct {
	scope
	name  string // as the request named it
	noun  string // in its NOT_FOUND: "site", "machine"
	typ   string // its Cedar entity type
	obj   T
	found bool
	res   func(T) iam.Resource
}

// lookupRef resolves name in the scope tenantRef names with get; a miss is
// not an error (the decision comes first, then notFound).
func lookupRef[T any](ctx context.Context, q store.Querier, tenantRef, name, noun, typ string,
	get func(context.Context, store.Querier, string, string, string) (T, error), res func(T) iam.Resource) (ref[T], error) {
	r := ref[T]{name: name, noun: noun, typ: typ, res: res}
	var err error
	if r.scope, err = tenancy.LookupScope(ctx, q, tenantRef); err != nil || !r.Found {
		return r, err
	}
	r.obj, err = get(ctx, q, r.ID(), name, "")
	if errors.Is(err, store.ErrNotFound) {
		return r, nil
	}
	r.found = err == nil
	return r, err
}

// resource is what a decision is made on: the resource, or its scope when
// it does not exist.
func (r ref[T]) resource() iam.Resource {
	if r.found {
		return r.res(r.obj)
	}
	return r.Missing(r.typ)
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
