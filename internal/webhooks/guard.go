package webhooks

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
)

// Guard keeps webhook deliveries off the control plane's own networks
// (SSRF). An endpoint whose host resolves to a loopback, private, shared
// (CGNAT) or benchmarking address is refused unless the operator allows
// private addresses (AllowPrivate) or, as `dev` does, loopback ones. Some
// addresses are refused whatever the flags: unspecified ones (0.0.0.0/8,
// ::, which reach this host), link-local ones and the clouds' metadata
// services, multicast and reserved ones, and the control plane's own API
// listener. An IPv6 address that carries an IPv4 one (IPv4-mapped, NAT64,
// 6to4, Teredo) is judged by that IPv4 address too.
//
// URLs are checked when an endpoint is created or updated, and every
// connection a delivery dials is checked again after its name resolved
// (DNS can change between the two), by Control on the dialer.
type Guard struct {
	// AllowPrivate allows loopback, private, shared and benchmarking
	// addresses (the operator's --webhook-allow-private); never the rest.
	AllowPrivate bool
	// AllowLoopback allows loopback addresses (dev).
	AllowLoopback bool
	// Resolver resolves hosts; default net.DefaultResolver.
	Resolver *net.Resolver

	mu   sync.Mutex
	self []netip.AddrPort
}

// AddSelf records an address the control plane's API listens on: deliveries
// to it are refused even where private or loopback addresses are allowed.
func (g *Guard) AddSelf(hostport string) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return
	}
	ap, err := netip.ParseAddrPort(net.JoinHostPort(strings.Trim(host, "[]"), port))
	if err != nil {
		if host == "" || host == "localhost" {
			ap, err = netip.ParseAddrPort(net.JoinHostPort("0.0.0.0", port))
		}
		if err != nil {
			return
		}
	}
	self := []netip.AddrPort{netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}
	if ap.Addr().IsUnspecified() {
		// A listener on every address answers on each of this host's
		// addresses, not only on loopback.
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if p, err := netip.ParsePrefix(a.String()); err == nil {
					self = append(self, netip.AddrPortFrom(p.Addr().Unmap(), ap.Port()))
				}
			}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.self = append(g.self, self...)
}

// AddSelfURL records the API's base URL (http://host:port).
func (g *Guard) AddSelfURL(raw string) {
	u, err := url.Parse(raw)
	if err != nil {
		return
	}
	g.AddSelf(u.Host)
}

// class is how far the flags let a delivery reach an address.
type class int

const (
	public   class = iota
	loopback       // allowed by AllowLoopback or AllowPrivate
	private        // allowed by AllowPrivate
	never          // allowed by no flag
)

// special lists the address ranges a delivery may not reach by default; the
// first match decides, so a narrower range comes before the one holding it.
var special = []struct {
	prefix netip.Prefix
	class  class
	what   string
}{
	// Connecting to an unspecified address reaches this host (and its API).
	{netip.MustParsePrefix("0.0.0.0/8"), never, "an unspecified address"},
	{netip.MustParsePrefix("::/128"), never, "an unspecified address"},
	{netip.MustParsePrefix("127.0.0.0/8"), loopback, "a loopback address"},
	{netip.MustParsePrefix("::1/128"), loopback, "a loopback address"},
	// Deprecated IPv4-compatible addresses (::a.b.c.d): no receiver lives there.
	{netip.MustParsePrefix("::/96"), never, "a reserved address"},
	// Cloud metadata services hand out instance credentials: never a
	// webhook receiver. Most answer on link-local 169.254.169.254 (AWS,
	// GCP, Azure, OCI, OpenStack), AWS ECS/EKS on 169.254.170.x; these sit
	// elsewhere.
	{netip.MustParsePrefix("100.100.100.200/32"), never, "a cloud metadata address"}, // Alibaba
	{netip.MustParsePrefix("168.63.129.16/32"), never, "a cloud metadata address"},   // Azure WireServer
	{netip.MustParsePrefix("fd00:ec2::254/128"), never, "a cloud metadata address"},  // AWS IMDS over IPv6
	{netip.MustParsePrefix("fd00:ec2::23/128"), never, "a cloud metadata address"},   // AWS EKS Pod Identity
	{netip.MustParsePrefix("169.254.0.0/16"), never, "a link-local address (cloud metadata lives there)"},
	{netip.MustParsePrefix("fe80::/10"), never, "a link-local address"},
	{netip.MustParsePrefix("224.0.0.0/4"), never, "a multicast address"},
	{netip.MustParsePrefix("ff00::/8"), never, "a multicast address"},
	// Class E and the limited broadcast address.
	{netip.MustParsePrefix("240.0.0.0/4"), never, "a reserved address"},
	{netip.MustParsePrefix("10.0.0.0/8"), private, "a private address"},
	{netip.MustParsePrefix("172.16.0.0/12"), private, "a private address"},
	{netip.MustParsePrefix("192.168.0.0/16"), private, "a private address"},
	{netip.MustParsePrefix("fc00::/7"), private, "a private address"},
	{netip.MustParsePrefix("fec0::/10"), private, "a private (site-local) address"},
	{netip.MustParsePrefix("100.64.0.0/10"), private, "a shared (CGNAT) address"},
	{netip.MustParsePrefix("198.18.0.0/15"), private, "a benchmarking address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), private, "a local-use NAT64 address"},
}

var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	nat64L = netip.MustParsePrefix("64:ff9b:1::/48")
	sixTo4 = netip.MustParsePrefix("2002::/16")
	teredo = netip.MustParsePrefix("2001::/32")
)

// embedded returns the IPv4 addresses an IPv6 address carries, which are
// where its packets end up: NAT64 (RFC 6052, the well-known /96 and the
// local-use /48), 6to4 (RFC 3056) and Teredo (RFC 4380: the server, and the
// client's address stored inverted). IPv4-mapped addresses are unmapped
// before this.
func embedded(a netip.Addr) []netip.Addr {
	if !a.Is6() {
		return nil
	}
	b := a.As16()
	v4 := func(b0, b1, b2, b3 byte) netip.Addr { return netip.AddrFrom4([4]byte{b0, b1, b2, b3}) }
	switch {
	case nat64.Contains(a):
		return []netip.Addr{v4(b[12], b[13], b[14], b[15])}
	case nat64L.Contains(a):
		// A /48 prefix puts the IPv4 address in bits 48-63 and 72-87,
		// around the reserved octet at 64-71.
		return []netip.Addr{v4(b[6], b[7], b[9], b[10])}
	case sixTo4.Contains(a):
		return []netip.Addr{v4(b[2], b[3], b[4], b[5])}
	case teredo.Contains(a):
		return []netip.Addr{v4(b[4], b[5], b[6], b[7]), v4(^b[12], ^b[13], ^b[14], ^b[15])}
	}
	return nil
}

// classify says which range holds a and what it is.
func classify(a netip.Addr) (class, string) {
	for _, r := range special {
		if r.prefix.Contains(a) {
			return r.class, r.what
		}
	}
	return public, ""
}

// checkAddr says why a delivery must not reach ap, or "" if it may.
func (g *Guard) checkAddr(ap netip.AddrPort) string {
	// A zone would keep the address out of every prefix.
	a := ap.Addr().Unmap().WithZone("")
	// The IPv4 address carried inside is where the packets end up, so it
	// names the refusal when both are refused.
	for _, e := range embedded(a) {
		if why := g.refusal(e, ap.Port()); why != "" {
			return "resolves to " + a.String() + ", which carries " + why
		}
	}
	if why := g.refusal(a, ap.Port()); why != "" {
		return "resolves to " + why
	}
	return ""
}

// refusal names what a is when a delivery must not reach it on port, or "".
func (g *Guard) refusal(a netip.Addr, port uint16) string {
	if g.isSelf(a, port) {
		return "the control plane's own API listener (" + netip.AddrPortFrom(a, port).String() + ")"
	}
	switch c, what := classify(a); {
	case c == public:
		return ""
	case c == never:
		return what + " (" + a.String() + ")"
	case c == private && !g.AllowPrivate, c == loopback && !g.AllowPrivate && !g.AllowLoopback:
		// Only these does the operator's flag admit: the hint goes here,
		// not on a malformed URL or a metadata address.
		return what + " (" + a.String() + "); the operator can allow private endpoints with --webhook-allow-private"
	}
	return ""
}

// isSelf says whether a connection to a on port reaches the control
// plane's own API listener.
func (g *Guard) isSelf(a netip.Addr, port uint16) bool {
	g.mu.Lock()
	self := g.self
	g.mu.Unlock()
	// A connection to an unspecified address lands on this host's
	// loopback, so it reaches a listener on loopback too.
	local := a.IsLoopback() || a.IsUnspecified()
	for _, s := range self {
		if s.Port() == port && (s.Addr() == a || (s.Addr().IsUnspecified() || s.Addr().IsLoopback()) && local) {
			return true
		}
	}
	return false
}

// CheckURL validates an endpoint URL and resolves its host: it returns the
// reason it is refused, or "".
func (g *Guard) CheckURL(ctx context.Context, raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "is not a URL"
	case u.Scheme != "https" && u.Scheme != "http":
		return "must be an http or https URL"
	case u.Host == "" || u.Hostname() == "":
		return "must name a host"
	case u.User != nil:
		return "must not carry credentials"
	case u.Fragment != "":
		return "must not have a fragment"
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	var p uint16
	if _, err := fmt.Sscanf(port, "%d", &p); err != nil {
		return "has an invalid port"
	}
	addrs, err := g.resolve(ctx, u.Hostname())
	if err != nil {
		return "host " + u.Hostname() + " does not resolve"
	}
	for _, a := range addrs {
		if why := g.checkAddr(netip.AddrPortFrom(a, p)); why != "" {
			return why
		}
	}
	return ""
}

func (g *Guard) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a}, nil
	}
	r := g.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	ips, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("no address for %s", host)
	}
	return ips, nil
}

// Control is a net.Dialer Control function: it refuses a connection to an
// address the guard forbids, whatever name resolved to it.
func (g *Guard) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("webhook delivery: unexpected address %q", address)
	}
	if why := g.checkAddr(ap); why != "" {
		return fmt.Errorf("webhook delivery refused: %s %s", address, why)
	}
	return nil
}
