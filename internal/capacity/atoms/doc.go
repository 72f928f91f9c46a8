// Package atoms keeps capacity's view of inventory in step: from the fleet's
// tables (nodes, gpus, mig_instances, nvlinks, numa_nodes, node_conditions)
// it derives pool membership, device atoms, host resources and the capacity
// rollups, and bumps a pool's version when what it offers changed.
//
// It reads the fleet's tables and never writes them (but for the pool
// conflict condition it owns). It never imports the placer or reservation:
// it tells them of pools that gained capacity through the Reconciler's Wake
// hook, which the application wires.
package atoms
