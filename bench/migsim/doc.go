// Package migsim measures MIG that follows demand: a pool of H100 nodes in a
// discrete one-minute time loop, where requests for 1g.10gb, 3g.40gb and
// 7g.80gb arrive with a mix that shifts over phases, wait in a queue for a
// bounded time and hold their instance for a random duration. Every request
// is placed by the real placement package against the current layouts.
// With a fixed layout the layouts never change; with auto, migplan runs
// every round on the queued and refused demand and each GPU it moves is
// frozen (partition pending) for the reconfiguration delay before its new
// instances can be booked.
//
//	go test ./bench/migsim -run TestMIGSim -v
//
// Runs are seeded and deterministic. The figures are in docs/benchmarks.md.
// It must never be imported, and touches no database, clock or network.
package migsim
