// Package placer is the owner of each pool: one placer per active pool holds
// the pool's in-memory index, places the mutations submitted to it against
// that index, and commits them in batches (multi-row inserts, one
// transaction, per-item savepoints only when the batch fails). Across
// replicas on PostgreSQL it elects each pool's placer with an advisory lock
// and tells the others where to forward.
//
// It never decides whether a caller may do something (the reservation
// service authenticates, validates and authorizes before it submits), never
// builds the API's events or drives a reservation's lifecycle, and never
// imports the reservation package: what it needs from there comes in as
// rows to stage or funcs to call. Nothing but a pool's placer changes that
// pool's index, and only after its transaction commits.
package placer
