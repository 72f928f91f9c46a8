package bctest

import (
	"sync"
	"time"
)

// SimClock is a clock.Clock that only moves when told to. It is safe for
// concurrent use.
type SimClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewSimClock returns a SimClock set to start (UTC); a zero start means a fixed
// date so that test output is reproducible.
func NewSimClock(start time.Time) *SimClock {
	if start.IsZero() {
		start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return &SimClock{now: start.UTC()}
}

// Now returns the simulated time.
func (c *SimClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and returns the new time.
func (c *SimClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// Set moves the clock to t.
func (c *SimClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t.UTC()
}

// CatchUp moves the clock forward to the wall clock if it is behind. A
// control plane's clock stands still while a test's hosts keep real time,
// so a command it sends late in a slow test carries a deadline (its clock
// plus the command's TTL) the host may already see as past: a test calls
// CatchUp before such a command rather than lengthening the TTL.
func (c *SimClock) CatchUp() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now().UTC(); now.After(c.now) {
		c.now = now
	}
}
