package envelope

import (
	"cmp"
	"math"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limits bound what one principal may ask of the API at once. They are per
// replica: a principal spread over N replicas gets up to N times each. Zero
// means no limit; serve and dev set their defaults from flags.
type Limits struct {
	// RequestRate is the requests per second one principal may make over
	// time; RequestBurst how many it may make at once (default twice the
	// rate). Opening a watch counts as one request.
	RequestRate  float64
	RequestBurst int
	// MaxStreams is how many watch streams one principal may hold open.
	MaxStreams int
}

func (l Limits) withDefaults() Limits {
	if l.RequestRate > 0 {
		l.RequestBurst = cmp.Or(l.RequestBurst, max(1, int(math.Ceil(2*l.RequestRate))))
	}
	return l
}

// principalLimiter keeps a token bucket and an open-stream count per
// principal, on the envelope's clock.
type principalLimiter struct {
	limits Limits
	// maxPrincipals bounds the map; idle entries are pruned past it.
	maxPrincipals int

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	streams map[string]int
}

func newPrincipalLimiter(l Limits) *principalLimiter {
	return &principalLimiter{limits: l.withDefaults(), maxPrincipals: 10000,
		buckets: map[string]*rate.Limiter{}, streams: map[string]int{}}
}

// allow takes one request from principal's bucket at now, or says how long
// to wait for the next token.
func (p *principalLimiter) allow(principal string, now time.Time) error {
	if p.limits.RequestRate <= 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.buckets[principal]
	if !ok {
		if len(p.buckets) >= p.maxPrincipals {
			p.pruneLocked(now)
		}
		b = rate.NewLimiter(rate.Limit(p.limits.RequestRate), p.limits.RequestBurst)
		p.buckets[principal] = b
	}
	r := b.ReserveN(now, 1)
	if !r.OK() {
		return rateLimited(time.Second)
	}
	if d := r.DelayFrom(now); d > 0 {
		// Not taken: a refused request must not push the next one back.
		r.CancelAt(now)
		return rateLimited(d)
	}
	return nil
}

// pruneLocked forgets principals whose bucket is full again: forgetting
// them changes nothing.
func (p *principalLimiter) pruneLocked(now time.Time) {
	for k, b := range p.buckets {
		if b.TokensAt(now) >= float64(b.Burst()) {
			delete(p.buckets, k)
		}
	}
}

// openStream counts one more open stream of principal, or refuses it;
// the caller calls the returned func when the stream ends.
func (p *principalLimiter) openStream(principal string) (func(), error) {
	if p.limits.MaxStreams <= 0 {
		return func() {}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streams[principal] >= p.limits.MaxStreams {
		return nil, &Error{
			Code:       CodeTooManyStreams,
			Message:    "too many open watch streams for this principal (at most " + strconv.Itoa(p.limits.MaxStreams) + "); close one and retry",
			RetryAfter: time.Second,
		}
	}
	p.streams[principal]++
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.streams[principal]--; p.streams[principal] <= 0 {
				delete(p.streams, principal)
			}
		})
	}, nil
}

func rateLimited(retry time.Duration) *Error {
	// Round up to whole seconds: Retry-After has no finer unit, and a
	// client that waits less is refused again.
	secs := max(1, int(math.Ceil(retry.Seconds())))
	return &Error{
		Code:       CodeRateLimited,
		Message:    "too many requests from this principal; retry in " + strconv.Itoa(secs) + "s",
		RetryAfter: time.Duration(secs) * time.Second,
	}
}
