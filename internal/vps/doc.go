// Package vps is the instance control plane's catalog and addressing:
// flavors (the sizes instances come in, the platform's or a tenant's) and
// IP pools with their leases (IPAM), from which a guest gets its address,
// gateway and nameservers.
//
// It must never hand one address to two holders: a lease is a row whose
// primary key is the pool and the address, allocated under the pool's row
// lock, so the database backs the invariant.
package vps
