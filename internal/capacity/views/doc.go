// Package views reads capacity: the rollups of atoms per (pool, GPU model,
// atom kind) that the reservation engine keeps as insert-only deltas in
// capacity_deltas, the CapacityService API over them (summary, by pool,
// timeline, rebuild), and the upkeep of the rollups: Compact folds the
// deltas, Check compares them with a recomputation from atoms, node_pools,
// reservations and bookings, and Rebuild replaces them with it.
//
// A rollup key is (pool_id, model, kind) for kind gpu, mig or slot (never
// cpu). total counts the key's atoms on nodes in the pool; quarantined those
// of them quarantined or waiting for a MIG repartition; booked the atoms of
// the key held by placed, binding or active reservations of the pool. free
// is max(0, total - booked - quarantined). pending, the reservations of a
// pool waiting for capacity, is not kept in the rollup: it is counted on
// read.
//
// It must never change atoms, memberships, reservations or bookings, nor
// insert deltas for changes of them: the engine that makes a change writes
// its delta in the same transaction. It only folds and rebuilds the deltas,
// and every API call goes through the envelope.
package views
