package pxe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// LeaseState is where an address is in its DHCP life.
type LeaseState string

const (
	// LeaseOffered: held for a client between OFFER and REQUEST.
	LeaseOffered LeaseState = "offered"
	// LeaseBound: acknowledged to the client until Expires.
	LeaseBound LeaseState = "bound"
	// LeaseReleased: the client gave it back; it stays remembered so the same
	// MAC gets the same address next time, and is free for others.
	LeaseReleased LeaseState = "released"
	// LeaseDeclined: a client found the address in use (DHCPDECLINE); nobody
	// gets it until Expires.
	LeaseDeclined LeaseState = "declined"
)

// Lease is one address of the range and who holds it.
type Lease struct {
	IP      netip.Addr
	MAC     string // canonical lower-case "aa:bb:…"; empty for a declined address
	State   LeaseState
	Expires time.Time
}

// holds reports whether the lease keeps the address from other clients at now.
func (l Lease) holds(now time.Time) bool {
	switch l.State {
	case LeaseOffered, LeaseBound, LeaseDeclined:
		return now.Before(l.Expires)
	default:
		return false
	}
}

// LeaseStore keeps leases across restarts of the site agent. The server keeps
// its own index in memory and decides allocation under one lock; the store
// only records the outcome, so an implementation needs no locking of its own
// beyond being safe for concurrent calls.
type LeaseStore interface {
	// Leases returns every recorded lease (read once at Start).
	Leases(ctx context.Context) ([]Lease, error)
	// PutLease records the lease for l.IP, replacing any earlier one.
	PutLease(ctx context.Context, l Lease) error
}

// MemLeases is a LeaseStore in memory: leases survive a Server restart
// within one process (and tests), not a process restart.
type MemLeases struct {
	mu     sync.Mutex
	leases map[netip.Addr]Lease
}

// Leases implements LeaseStore.
func (m *MemLeases) Leases(context.Context) ([]Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Lease, 0, len(m.leases))
	for _, l := range m.leases {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Lease) int { return a.IP.Compare(b.IP) })
	return out, nil
}

// PutLease implements LeaseStore.
func (m *MemLeases) PutLease(_ context.Context, l Lease) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.leases == nil {
		m.leases = map[netip.Addr]Lease{}
	}
	m.leases[l.IP] = l
	return nil
}

// errNoAddress: every address of the range is held.
var errNoAddress = errors.New("dhcp range exhausted")

// pool allocates addresses of one range. All decisions happen under mu, so
// two clients never get the same address; the store sees each outcome in the
// same critical section, so its order matches the index.
type pool struct {
	mu         sync.Mutex
	start, end netip.Addr
	reserved   map[netip.Addr]bool // server, router: never handed out
	byIP       map[netip.Addr]Lease
	store      LeaseStore
}

func newPool(ctx context.Context, start, end netip.Addr, reserved []netip.Addr, store LeaseStore) (*pool, error) {
	p := &pool{start: start, end: end, reserved: map[netip.Addr]bool{}, byIP: map[netip.Addr]Lease{}, store: store}
	for _, r := range reserved {
		if r.IsValid() {
			p.reserved[r] = true
		}
	}
	leases, err := store.Leases(ctx)
	if err != nil {
		return nil, fmt.Errorf("load leases: %w", err)
	}
	for _, l := range leases {
		if p.inRange(l.IP) {
			p.byIP[l.IP] = l
		}
	}
	return p, nil
}

func (p *pool) inRange(ip netip.Addr) bool {
	return ip.IsValid() && ip.Is4() && p.start.Compare(ip) <= 0 && ip.Compare(p.end) <= 0 && !p.reserved[ip]
}

// putLocked records l in the index and the store.
func (p *pool) putLocked(ctx context.Context, l Lease) error {
	if err := p.store.PutLease(ctx, l); err != nil {
		return fmt.Errorf("store lease %s: %w", l.IP, err)
	}
	p.byIP[l.IP] = l
	return nil
}

// freeForLocked reports whether ip can go to mac at now.
func (p *pool) freeForLocked(ip netip.Addr, mac string, now time.Time) bool {
	if !p.inRange(ip) {
		return false
	}
	l, ok := p.byIP[ip]
	return !ok || l.MAC == mac || !l.holds(now)
}

// Offer picks an address for mac and holds it until now+hold. The choice is
// deterministic: the address mac last had (held or remembered), else the
// requested one if free, else the lowest never-used address, else the lowest
// lapsed one.
func (p *pool) Offer(ctx context.Context, mac string, requested netip.Addr, now time.Time, hold time.Duration) (netip.Addr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ip, ok := p.previousLocked(mac, now)
	if !ok && requested.IsValid() && p.freeForLocked(requested, mac, now) {
		ip, ok = requested, true
	}
	if !ok {
		ip, ok = p.lowestFreeLocked(mac, now)
	}
	if !ok {
		return netip.Addr{}, errNoAddress
	}
	l := p.byIP[ip]
	if l.MAC == mac && l.State == LeaseBound && l.holds(now) {
		// Already bound (a client rediscovering): keep the binding as it is.
		return ip, nil
	}
	return ip, p.putLocked(ctx, Lease{IP: ip, MAC: mac, State: LeaseOffered, Expires: now.Add(hold)})
}

// previousLocked finds the address mac holds or last held, if still free for it.
func (p *pool) previousLocked(mac string, now time.Time) (netip.Addr, bool) {
	var best netip.Addr
	for ip, l := range p.byIP {
		if l.MAC != mac || !p.freeForLocked(ip, mac, now) {
			continue
		}
		if !best.IsValid() || ip.Less(best) {
			best = ip
		}
	}
	return best, best.IsValid()
}

func (p *pool) lowestFreeLocked(mac string, now time.Time) (netip.Addr, bool) {
	var lapsed netip.Addr
	for ip := p.start; ip.IsValid() && ip.Compare(p.end) <= 0; ip = ip.Next() {
		if !p.inRange(ip) {
			continue
		}
		l, used := p.byIP[ip]
		if !used {
			return ip, true
		}
		if !lapsed.IsValid() && (l.MAC == mac || !l.holds(now)) {
			lapsed = ip
		}
	}
	return lapsed, lapsed.IsValid()
}

// Bind acknowledges ip to mac for d. It fails when ip is outside the range or
// held by another client; the caller answers NAK.
func (p *pool) Bind(ctx context.Context, mac string, ip netip.Addr, now time.Time, d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.freeForLocked(ip, mac, now) {
		return fmt.Errorf("address %s is not available to %s", ip, mac)
	}
	if l, ok := p.byIP[ip]; ok && l.State == LeaseDeclined && l.holds(now) {
		return fmt.Errorf("address %s was declined", ip)
	}
	// A client moving to a new address gives up its old one.
	for other, l := range p.byIP {
		if other != ip && l.MAC == mac && l.holds(now) && l.State != LeaseDeclined {
			if err := p.putLocked(ctx, Lease{IP: other, MAC: mac, State: LeaseReleased, Expires: now}); err != nil {
				return err
			}
		}
	}
	return p.putLocked(ctx, Lease{IP: ip, MAC: mac, State: LeaseBound, Expires: now.Add(d)})
}

// Renew extends a binding mac already holds on ip.
func (p *pool) Renew(ctx context.Context, mac string, ip netip.Addr, now time.Time, d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.byIP[ip]
	if !ok || l.MAC != mac || l.State != LeaseBound {
		return fmt.Errorf("no binding of %s to %s", ip, mac)
	}
	return p.putLocked(ctx, Lease{IP: ip, MAC: mac, State: LeaseBound, Expires: now.Add(d)})
}

// Release ends mac's hold on ip (DHCPRELEASE, or a REQUEST for another server).
func (p *pool) Release(ctx context.Context, mac string, ip netip.Addr, now time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.byIP[ip]
	if !ok || l.MAC != mac || l.State == LeaseDeclined || l.State == LeaseReleased {
		return nil
	}
	return p.putLocked(ctx, Lease{IP: ip, MAC: mac, State: LeaseReleased, Expires: now})
}

// Decline quarantines ip for d: a client found another host using it.
func (p *pool) Decline(ctx context.Context, mac string, ip netip.Addr, now time.Time, d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.byIP[ip]
	if !ok || l.MAC != mac {
		return fmt.Errorf("decline of %s by %s, which does not hold it", ip, mac)
	}
	return p.putLocked(ctx, Lease{IP: ip, State: LeaseDeclined, Expires: now.Add(d)})
}

// Lookup returns the lease bound to mac at now, if any.
func (p *pool) Lookup(mac string, now time.Time) (Lease, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.byIP {
		if l.MAC == mac && l.State == LeaseBound && l.holds(now) {
			return l, true
		}
	}
	return Lease{}, false
}

func macKey(hw net.HardwareAddr) string { return hw.String() }
