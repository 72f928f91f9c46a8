package bctest

import (
	"testing"
	"time"
)

// margin is kept back from the test binary's deadline so a wait that gives
// up still reports its own message rather than the runner's panic.
const margin = 5 * time.Second

// waitDeadline is when a wait gives up: shortly before the test binary's
// own deadline (go test -timeout), never on a fixed timeout of its own.
func waitDeadline(t testing.TB) (time.Time, bool) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			return dl.Add(-margin), true
		}
	}
	return time.Time{}, false
}

// WaitFor polls cond until it holds. A busy machine makes the wait longer,
// never the test red: it gives up only near the test binary's deadline, so
// the condition, not a guess at how long it takes, decides the test.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline, bounded := waitDeadline(t)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 50*time.Millisecond) {
		if bounded && time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s at the test deadline", what)
		}
		time.Sleep(pause)
	}
}

// Receive waits for a value on ch, bounded like WaitFor.
func Receive[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	var timeout <-chan time.Time
	if deadline, bounded := waitDeadline(t); bounded {
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case v := <-ch:
		return v
	case <-timeout:
		t.Fatalf("gave up waiting for %s at the test deadline", what)
		var zero T
		return zero
	}
}

// Deadline returns a channel that fires near the test binary's deadline,
// or never without one: the guard case of a select that waits on several
// channels.
func Deadline(t testing.TB) <-chan time.Time {
	if deadline, bounded := waitDeadline(t); bounded {
		return time.After(time.Until(deadline))
	}
	return nil
}
