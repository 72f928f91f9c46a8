// Package replicatorture holds the multi-replica torture test (issue 21):
// two real `better-compute serve` processes on one PostgreSQL database,
// simulated nodes split between their gateways, clients on both, and the
// owner of the busiest pool killed with SIGKILL and restarted while the
// booking invariants are checked in SQL after every round. It has no code
// outside its test and must never be imported: it exists to be run with
// BC_TEST_POSTGRES_URL set (see docs/testing.md).
package replicatorture
