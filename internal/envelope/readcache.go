package envelope

import (
	"context"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// decisionCache keeps read decisions for a short time: reads are frequent
// and a stale allow is bounded by the TTL (at most 10 s).
type decisionCache struct {
	ttl time.Duration
	max int

	mu      sync.Mutex
	entries map[string]cachedDecision
}

type cachedDecision struct {
	allowed bool
	expires time.Time
}

func newDecisionCache(ttl time.Duration, max int) *decisionCache {
	return &decisionCache{ttl: ttl, max: max, entries: make(map[string]cachedDecision)}
}

func (c *decisionCache) get(key string, now time.Time) (bool, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.entries[key]
	if !ok || !now.Before(d.expires) {
		return false, false
	}
	return d.allowed, true
}

func (c *decisionCache) put(key string, allowed bool, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		// Dropping everything is cheap and keeps memory bounded; the cache
		// refills within one TTL.
		c.entries = make(map[string]cachedDecision)
	}
	c.entries[key] = cachedDecision{allowed: allowed, expires: now.Add(c.ttl)}
}

func (c *decisionCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = make(map[string]cachedDecision)
}

// Resolve runs fn in a read transaction and maps store errors, for the
// lookups a read handler makes before its decision.
func (e *Envelope) Resolve(ctx context.Context, what string, fn func(ctx context.Context, q store.Querier) error) error {
	err := e.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error { return fn(ctx, tx) })
	return FromStore(err, what)
}

// AuthorizeRead makes the (cached) read decision for the current request's
// catalog action on res, returning a Connect error when refused.
func (e *Envelope) AuthorizeRead(ctx context.Context, res iam.Resource) error {
	if err := e.authorizeRead(ctx, res); err != nil {
		e.logError(ctx, err)
		return ToConnect(err)
	}
	return nil
}

func (e *Envelope) authorizeRead(ctx context.Context, res iam.Resource) error {
	info := InfoFrom(ctx)
	caller, ok := CallerFrom(ctx)
	if !ok || info.Method.Kind != KindRead {
		return &Error{Code: CodeInternal, Message: "internal error"}
	}
	action := info.Method.Action
	key := caller.Principal.ID + "\x00" + string(caller.Principal.Role) + "\x00" + action + "\x00" + res.Type + "\x00" + res.ID + "\x00" + res.TenantID + "\x00" + res.ProjectID
	now := e.cfg.Clock.Now()
	allowed, hit := e.readCache.get(key, now)
	if !hit {
		dec, err := e.cfg.Authz.Authorize(ctx, iam.Request{Principal: caller.Principal, Action: action, Resource: res, Context: map[string]any{"confirmed": false}})
		if err != nil {
			e.observe(action, DecisionError)
			return &Error{Code: CodeAuthorizationFailed, Message: "authorization is unavailable", Err: err}
		}
		allowed = dec.Allowed
		e.observe(action, decisionName(allowed))
		e.readCache.put(key, allowed, now)
	}
	if !allowed {
		return e.refusal(ctx, caller, action, res)
	}
	return nil
}

func decisionName(allowed bool) string {
	if allowed {
		return DecisionAllow
	}
	return DecisionDeny
}

// Fail converts an error from a read handler into a Connect error and logs
// it; handlers return Fail(err) for anything but success.
func (e *Envelope) Fail(ctx context.Context, err error) *connect.Error {
	e.logError(ctx, err)
	return ToConnect(err)
}
