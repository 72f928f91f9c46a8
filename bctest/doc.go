// Package bctest is the public testing kit of Better Compute: a settable
// clock, throw-away stores on SQLite or PostgreSQL, and the conformance suites
// that every backend must pass. Fakes live here and in tests only; every fake
// speaks the real protocol.
//
// Nothing in the control plane or the agent may import it; the one
// exception is `better-compute dev --sim-nodes`, which runs FleetSim.
package bctest
