package envelope

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// decisionCache keeps read decisions for a short time: reads are frequent
// and a stale allow is bounded by the TTL (at most 10 s).
type decisionCache struct {
	ttl  time.Duration
	max  int
	seed maphash.Seed

	mu      sync.Mutex
	entries map[readKey]cachedDecision
}

// readKey is everything a read decision depends on. The identity fields are
// kept whole; the resource attributes and the decision context are folded
// into one hash of their canonical encoding, so a 1-GPU preview's allow is
// never reused for a 1,024-GPU one. The hash is seeded per process, so a
// caller cannot craft two requests that collide.
type readKey struct {
	principal, role, action               string
	resType, resID, resTenant, resProject string
	facts                                 uint64
}

type cachedDecision struct {
	allowed bool
	expires time.Time
}

func newDecisionCache(ttl time.Duration, max int) *decisionCache {
	return &decisionCache{ttl: ttl, max: max, seed: maphash.MakeSeed(), entries: make(map[readKey]cachedDecision)}
}

// key returns the cache key of a read decision, and false when the
// attributes or context hold a value without a canonical encoding: such a
// decision is made afresh every time rather than risk a wrong reuse.
func (c *decisionCache) key(p iam.Principal, action string, res iam.Resource, decisionCtx map[string]any) (readKey, bool) {
	var h maphash.Hash
	h.SetSeed(c.seed)
	ok := hashValue(&h, res.Attrs)
	h.WriteByte(0xff)
	ok = ok && hashValue(&h, decisionCtx)
	return readKey{
		principal: p.ID, role: string(p.Role), action: action,
		resType: res.Type, resID: res.ID, resTenant: res.TenantID, resProject: res.ProjectID,
		facts: h.Sum64(),
	}, ok
}

// hashValue writes a canonical, self-delimiting encoding of v: a type tag,
// then the value, lengths before contents and map keys in order, so two
// different values never encode alike. It covers the types iam.Resource
// attributes and decision contexts may hold.
func hashValue(h *maphash.Hash, v any) bool {
	var n [8]byte
	num := func(x uint64) {
		binary.LittleEndian.PutUint64(n[:], x)
		h.Write(n[:])
	}
	str := func(s string) {
		num(uint64(len(s)))
		h.WriteString(s)
	}
	switch v := v.(type) {
	case nil:
		h.WriteByte('n')
	case string:
		h.WriteByte('s')
		str(v)
	case bool:
		h.WriteByte('b')
		if v {
			h.WriteByte(1)
		} else {
			h.WriteByte(0)
		}
	case int:
		// int and int64 mean the same Cedar Long.
		h.WriteByte('i')
		num(uint64(v))
	case int64:
		h.WriteByte('i')
		num(uint64(v))
	case []string:
		h.WriteByte('l')
		num(uint64(len(v)))
		for _, s := range v {
			str(s)
		}
	case map[string]any:
		h.WriteByte('m')
		num(uint64(len(v)))
		var small [16]string // most attribute maps fit: no allocation
		keys := small[:0]
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			str(k)
			if !hashValue(h, v[k]) {
				return false
			}
		}
	default:
		return false
	}
	return true
}

func (c *decisionCache) get(key readKey, now time.Time) (bool, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.entries[key]
	if !ok || !now.Before(d.expires) {
		return false, false
	}
	return d.allowed, true
}

func (c *decisionCache) put(key readKey, allowed bool, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		// Dropping everything is cheap and keeps memory bounded; the cache
		// refills within one TTL.
		c.entries = make(map[readKey]cachedDecision)
	}
	c.entries[key] = cachedDecision{allowed: allowed, expires: now.Add(c.ttl)}
}

func (c *decisionCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = make(map[readKey]cachedDecision)
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
	allowed, err := e.decideRead(ctx, res)
	if err != nil {
		return err
	}
	if !allowed {
		caller, _ := CallerFrom(ctx)
		return e.refusal(ctx, caller, InfoFrom(ctx).Method.Action, res)
	}
	return nil
}

// decideRead makes the (cached) read decision for the current request's
// catalog action on res. It returns an error only when no decision could
// be made.
func (e *Envelope) decideRead(ctx context.Context, res iam.Resource) (bool, error) {
	info := InfoFrom(ctx)
	caller, ok := CallerFrom(ctx)
	if !ok || info.Method.Kind != KindRead {
		return false, &Error{Code: CodeInternal, Message: "internal error"}
	}
	action := info.Method.Action
	// The context is part of the key too, so a read that one day adds
	// request facts to it cannot be answered from another's decision.
	decisionCtx := map[string]any{iam.ContextConfirmed: false}
	key, cacheable := e.readCache.key(caller.Principal, action, res, decisionCtx)
	now := e.cfg.Clock.Now()
	if cacheable {
		if allowed, hit := e.readCache.get(key, now); hit {
			spanDecision(ctx, decisionName(allowed))
			return allowed, nil
		}
	}
	dec, err := e.cfg.Authz.Authorize(ctx, iam.Request{Principal: caller.Principal, Action: action, Resource: res, Context: decisionCtx})
	if err != nil {
		e.observe(ctx, action, DecisionError)
		return false, &Error{Code: CodeAuthorizationFailed, Message: "authorization is unavailable", Err: err}
	}
	e.observe(ctx, action, decisionName(dec.Allowed))
	if cacheable {
		e.readCache.put(key, dec.Allowed, now)
	}
	return dec.Allowed, nil
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
