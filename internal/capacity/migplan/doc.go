// Package migplan decides how a pool's MIG layouts should follow demand: given
// the requests per MIG profile that went unmet over a window (queued and
// refused), the pool's GPUs with their current layouts and whether any atom
// of each is booked, it proposes new layouts for idle GPUs only.
//
// A proposal is always a layout NVIDIA's slice arithmetic allows for the GPU
// model (Layouts enumerates them from each profile's compute slices, memory
// slices and start positions), never touches a busy, frozen or quarantined
// GPU, moves at most MaxMoves GPUs per round, and is made only when it lowers
// the unmet demand that the free instances already in the pool cannot serve
// (weighted by compute slices): demand that idle capacity already covers
// moves nothing, so balanced demand never flips a GPU back and forth.
//
// Like placement, it is pure logic over values the caller loads: it must
// never touch the database, take a lock or read the clock. The caller freezes
// each proposed GPU (partition pending) in the transaction that re-checks it
// is still idle, and asks the node to apply the layout.
package migplan
