// Package reservation serves ReservationService and carries a reservation
// through its life: it decides each request, submits it to its pool's
// placer (package placer), binds placed reservations on their node through
// the fleet's command path, and runs the tick, the queue and the archive as
// River jobs.
//
// It never places into or changes a pool's index itself (only the pool's
// placer does), and never writes the fleet's tables (nodes, gpus,
// mig_instances, nvlinks, numa_nodes, node_conditions), which it reads as a
// read model; it sends commands through the CommandSender port the
// application wires.
package reservation
