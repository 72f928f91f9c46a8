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
// A full scan of a pool allocates nothing per node, so Place over 10,000
// nodes costs well under a millisecond (BenchmarkPlaceFullScan): each
// node's detail carries a digest built with the Snapshot (its free whole
// GPUs with their islands and NUMA nodes, free host resources, free CPUs
// per NUMA node and tenants), so the common case reads a few cache lines
// per node; a call's working memory comes from a pool; feasible nodes are
// ranked as (score, node) pairs, and plans, atom strings and cpusets are
// built only for the ones returned; rejections are counted per class in a
// short list and moved into the Explanation's maps once per class; and once
// the top is full, a whole-GPU node that could not enter it even with the
// best topology and fragmentation scores is counted feasible without
// picking its GPUs. The results are those of the straightforward
// implementation, which reference_test.go keeps and the tests compare with.
//
// Placement is pure logic. It must never touch the database, take a lock or
// read the clock: the caller loads the Snapshot (before any lock is taken),
// calls Place, and commits the chosen plan itself, re-checking the atoms
// under its own transaction.
package placement
