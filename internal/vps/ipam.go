package vps

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// addrOrdinal is an IPv4 address as an integer.
func addrOrdinal(a netip.Addr) int64 {
	b := a.As4()
	return int64(binary.BigEndian.Uint32(b[:]))
}

// ordinalAddr is the IPv4 address of an integer.
func ordinalAddr(n int64) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(n))
	return netip.AddrFrom4(b)
}

// LeaseAllocate leases the pool's lowest free address to holder, under the
// pool's row lock, in the caller's transaction. A full pool is
// RESOURCE_EXHAUSTED naming field (the request field that chose the pool).
// A holder that already holds a lease of the pool gets it back.
func LeaseAllocate(ctx context.Context, tx store.Tx, now time.Time, poolID, holder, mac, field string) (IPLease, IPPool, error) {
	p, err := IPPoolLock(ctx, tx, poolID)
	if errors.Is(err, store.ErrNotFound) {
		return IPLease{}, p, envelope.NotFound("ip pool", poolID)
	}
	if err != nil {
		return IPLease{}, p, err
	}
	leases, err := IPLeaseList(ctx, tx, poolID)
	if err != nil {
		return IPLease{}, p, err
	}
	for _, l := range leases {
		if l.Holder == holder {
			return l, p, nil
		}
	}
	next := firstFree(p.RangeFirst, p.RangeLast, leases)
	if next < 0 {
		return IPLease{}, p, &envelope.Error{Code: envelope.CodeResourceExhaustedLimit,
			Message:    fmt.Sprintf("ip pool %s is exhausted: all %d addresses of %s are leased", p.Name, p.Size(), p.CIDR),
			Violations: []envelope.Violation{{Field: field, Reason: fmt.Sprintf("ip pool %s has no free address", p.Name)}}}
	}
	l := IPLease{PoolID: p.ID, Ordinal: next, Address: ordinalAddr(next).String(), Holder: holder, MAC: mac, CreateTime: now}
	if err := IPLeaseInsert(ctx, tx, &l); err != nil {
		return IPLease{}, p, err
	}
	return l, p, nil
}

// firstFree is the lowest address of [first, last] no lease holds, or -1.
// leases are in address order.
func firstFree(first, last int64, leases []IPLease) int64 {
	next := first
	for _, l := range leases {
		switch {
		case l.Ordinal < next:
			continue
		case l.Ordinal == next:
			next++
		default:
			return next
		}
	}
	if next > last {
		return -1
	}
	return next
}

// LeaseRelease gives the holder's address of the pool back; releasing a
// lease that is gone is not an error (release is retried).
func LeaseRelease(ctx context.Context, tx store.Tx, poolID, holder string) (bool, error) {
	return IPLeaseDeleteHolder(ctx, tx, poolID, holder)
}
