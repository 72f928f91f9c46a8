package iam

import (
	"context"
	"sync"
)

// Counting wraps an Authorizer and counts its calls, so tests can prove the
// envelope asks exactly once per mutation (a second ask could see different
// policies and disagree with the first).
type Counting struct {
	inner Authorizer

	mu       sync.Mutex
	total    int
	byAction map[string]int
}

// NewCounting wraps inner.
func NewCounting(inner Authorizer) *Counting {
	return &Counting{inner: inner, byAction: map[string]int{}}
}

// Authorize counts the call, then delegates.
func (c *Counting) Authorize(ctx context.Context, req Request) (Decision, error) {
	c.mu.Lock()
	c.total++
	c.byAction[req.Action]++
	c.mu.Unlock()
	return c.inner.Authorize(ctx, req)
}

// Calls returns the number of calls since creation or the last Reset.
func (c *Counting) Calls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// CallsFor returns the number of calls for one action.
func (c *Counting) CallsFor(action string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byAction[action]
}

// Reset zeroes the counters.
func (c *Counting) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total = 0
	c.byAction = map[string]int{}
}
