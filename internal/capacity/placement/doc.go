// Package placement decides where a GPU request fits: it filters the nodes of
// a read-only Snapshot through a chain of one-method feasibility checkers,
// picks the atoms to book on each feasible node (whole GPUs, MIG instances,
// shared slots, host resources), ranks the candidates with weighted scorers
// and returns the best N plans together with an Explanation of every
// rejection, counted by reason and by node class, so a preview can answer
// "why doesn't it fit?".
//
// The design follows Nomad's scheduler/feasible: checkers and scorers are
// small and composable, and a node is rejected by the first checker that
// fails, with that checker's reason.
//
// Placement is pure logic. It must never touch the database, take a lock or
// read the clock: the caller loads the Snapshot (before any lock is taken),
// calls Place, and commits the chosen plan itself, re-checking the atoms
// under its own transaction.
package placement
