// Package pool owns the pools table and the PoolService API: a tenant's
// named sets of nodes, chosen by a selector over node labels, with the
// policy that says how their GPUs are shared and booked.
//
// It must never decide access itself (every API call goes through the
// envelope). It does not place or book anything: placement and booking read
// pools, they are not written from here.
package pool
