// Package clock is the one source of time for the control plane. Every
// component takes a Clock so that tests and simulations can move time for the
// whole system; SQL reads the same clock through compute_now().
//
// It must never read the wall clock anywhere but in Real.
package clock

import "time"

// Clock tells the current time.
type Clock interface {
	Now() time.Time
}

// Real is the system clock.
type Real struct{}

// Now returns the current UTC time.
func (Real) Now() time.Time { return time.Now().UTC() }

// IsReal reports whether c is the system clock, so the store can let the
// database anchor time instead of shipping the Go clock with every transaction.
func IsReal(c Clock) bool {
	_, ok := c.(Real)
	return ok
}
