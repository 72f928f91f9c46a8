package envelope

import (
	"sync"
	"time"
)

// ResultAuditLimited is the result of the last refusal recorded for a
// principal in a window: the ones after it, until the window ends, are
// refused all the same but not written to the audit log.
const ResultAuditLimited = "AUDIT_RATE_LIMITED"

// refusalLimiter bounds the audit rows that one principal's refusals write.
// Refusals land in the audit log of the tenant that was targeted, so without
// a bound anyone with a key could fill a victim tenant's log (and disk).
type refusalLimiter struct {
	limit  int
	window time.Duration
	// maxPrincipals bounds the map; expired windows are pruned past it.
	maxPrincipals int

	mu   sync.Mutex
	seen map[string]*refusalWindow
}

type refusalWindow struct {
	start time.Time
	n     int
}

// refusalVerdict says what to do with one refusal's audit row.
type refusalVerdict int

const (
	refusalRecord refusalVerdict = iota
	// refusalRecordLast records the row marked ResultAuditLimited.
	refusalRecordLast
	refusalDrop
)

func newRefusalLimiter(limit int, window time.Duration) *refusalLimiter {
	return &refusalLimiter{limit: limit, window: window, maxPrincipals: 10000, seen: map[string]*refusalWindow{}}
}

// admit counts one refusal of principal at now.
func (l *refusalLimiter) admit(principal string, now time.Time) (refusalVerdict, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.seen[principal]
	if !ok || !now.Before(w.start.Add(l.window)) {
		if !ok && len(l.seen) >= l.maxPrincipals {
			l.pruneLocked(now)
		}
		w = &refusalWindow{start: now}
		l.seen[principal] = w
	}
	w.n++
	end := w.start.Add(l.window)
	switch {
	case w.n <= l.limit:
		return refusalRecord, end
	case w.n == l.limit+1:
		return refusalRecordLast, end
	default:
		return refusalDrop, end
	}
}

func (l *refusalLimiter) pruneLocked(now time.Time) {
	for p, w := range l.seen {
		if !now.Before(w.start.Add(l.window)) {
			delete(l.seen, p)
		}
	}
	if len(l.seen) >= l.maxPrincipals {
		// Every window is live: forgetting them all at worst lets each
		// principal write one more window's rows.
		l.seen = map[string]*refusalWindow{}
	}
}
