package tenancy

import (
	"context"
	"errors"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// ItemKind is a kind of tenant-owned item (an instance, a volume, a
// sandbox, a template) as a request names one: its Cedar type, its noun in
// NOT_FOUND, its resource, and how a tenant's item is read by id or name.
type ItemKind[T any] struct {
	Type, Noun string
	Resource   func(T) iam.Resource
	Get        func(ctx context.Context, q store.Querier, tenantID, ref string) (T, error)
}

// Item is an item resolved before a decision: the scope the request named
// and the item, when it exists.
type Item[T any] struct {
	Scope Scope
	Obj   T
	Found bool
	kind  *ItemKind[T]
}

// Lookup resolves ref in the scope tenantRef names. A miss is not an
// error: the decision comes first (on Resource), then NotFound.
func (k *ItemKind[T]) Lookup(ctx context.Context, q store.Querier, tenantRef, ref string) (Item[T], error) {
	r := Item[T]{kind: k}
	var err error
	if r.Scope, err = LookupScope(ctx, q, tenantRef); err != nil || !r.Scope.Found {
		return r, err
	}
	r.Obj, err = k.Get(ctx, q, r.Scope.ID(), ref)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return r, nil
	case err != nil:
		return r, err
	}
	r.Found = true
	return r, nil
}

// Resource is what the decision is made on: the item, or on a miss its
// scope (Scope.Missing), so a stranger learns nothing.
func (r Item[T]) Resource() iam.Resource {
	if r.Found {
		return r.kind.Resource(r.Obj)
	}
	return r.Scope.Missing(r.kind.Type)
}

// NotFound is the error for a tenant or item that does not exist, after
// the decision.
func (r Item[T]) NotFound(ref string) error {
	if err := r.Scope.NotFound(); err != nil {
		return err
	}
	if !r.Found {
		return envelope.NotFound(r.kind.Noun, ref)
	}
	return nil
}
