// Package reservation books capacity: it keeps pool membership, device atoms
// and host resources in step with inventory, places reservations with the
// placement pipeline (inline, then a queued placer), binds them on their
// node through the fleet's command path, and serves ReservationService.
//
// It reads the fleet's tables (nodes, gpus, mig_instances, nvlinks,
// numa_nodes, node_conditions) as a read model and never writes them; it
// sends commands through the CommandSender port the application wires.
package reservation
