package pool

import (
	"context"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/dirversion"
)

// VisibleCacheName names the cache of ResolveVisibleCached in dirversion's
// statistics.
const VisibleCacheName = "pool.visible"

// visible caches the pools tenants resolved, by the tenant's id and the
// reference it gave, so one tenant's reference never finds a pool resolved
// for another. It holds only pools found, at the request's directory
// version: Insert, Update, Archive and SetOffer move it on, and so do the
// writes to tenants the owner/name form and the owner's name depend on.
var visible = dirversion.NewCache[visibleKey, Resolved](VisibleCacheName, 10000)

type visibleKey struct{ tenantID, ref string }

// Resolved is a pool a tenant may reserve from, with its policy decoded
// (Policy). Both are shared between requests: never modify them.
type Resolved struct {
	Pool   Pool
	Policy *apiv1.PoolPolicy
}

// ResolveVisibleCached is ResolveVisible answered from the directory cache
// at the request's directory version when it can be (see store/dirversion),
// with the pool's policy decoded once per version. Use it to resolve a
// request before its decision, not inside a write transaction: what a
// mutation relies on it reads again under its own lock. Misses and
// ambiguous names are read afresh every time.
func ResolveVisibleCached(ctx context.Context, q store.Querier, tenantID, ref string) (Resolved, bool, *Ambiguous, error) {
	key := visibleKey{tenantID: tenantID, ref: ref}
	if r, ok := visible.Get(ctx, key); ok {
		return r, true, nil, nil
	}
	p, found, amb, err := ResolveVisible(ctx, q, tenantID, ref)
	if err != nil || !found {
		return Resolved{}, found, amb, err
	}
	r := Resolved{Pool: p, Policy: Policy(p)}
	visible.Put(ctx, key, r)
	return r, true, nil, nil
}

// policies memoizes decoded policies by their stored text: decoding is a
// pure function of the text, so an entry is never stale, whatever the
// database holds.
var policies = struct {
	sync.Mutex
	m map[string]*apiv1.PoolPolicy
}{m: map[string]*apiv1.PoolPolicy{}}

// maxPolicies bounds the memo; past it, it is dropped and refilled.
const maxPolicies = 1024

// Policy returns p's policy as Proto(p).Policy has it — decoded, defaults
// filled, the default policy for text that does not decode — decoding each
// distinct text once. The result is shared: never modify it.
func Policy(p Pool) *apiv1.PoolPolicy {
	policies.Lock()
	pol, ok := policies.m[p.Policy]
	policies.Unlock()
	if ok {
		return pol
	}
	pol = &apiv1.PoolPolicy{}
	if protojson.Unmarshal([]byte(p.Policy), pol) != nil {
		pol = &apiv1.PoolPolicy{}
	}
	pol = normalPolicy(pol)
	policies.Lock()
	if len(policies.m) >= maxPolicies {
		policies.m = map[string]*apiv1.PoolPolicy{}
	}
	policies.m[p.Policy] = pol
	policies.Unlock()
	return pol
}
