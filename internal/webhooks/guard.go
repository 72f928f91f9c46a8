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
// (SSRF): an endpoint whose host resolves to a loopback, link-local,
// private, shared (CGNAT), multicast or unspecified address is refused, and
// so is the control plane's own API listener, unless the operator allows
// private addresses (AllowPrivate) or, as `dev` does, loopback ones.
//
// URLs are checked when an endpoint is created or updated, and every
// connection a delivery dials is checked again (DNS can change between the
// two), by Control on the dialer.
type Guard struct {
	// AllowPrivate allows every address (the operator's --webhook-allow-private).
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

var sharedCGNAT = netip.MustParsePrefix("100.64.0.0/10")

// checkAddr says why a delivery must not reach addr, or "" if it may.
func (g *Guard) checkAddr(ap netip.AddrPort) string {
	a := ap.Addr().Unmap()
	g.mu.Lock()
	self := g.self
	g.mu.Unlock()
	for _, s := range self {
		if s.Port() != ap.Port() {
			continue
		}
		if s.Addr() == a || (s.Addr().IsUnspecified() && (a.IsLoopback() || a.IsUnspecified())) ||
			(s.Addr().IsLoopback() && a.IsLoopback()) {
			return "is the control plane's own API listener"
		}
	}
	if g.AllowPrivate {
		return ""
	}
	switch {
	case a.IsLoopback():
		if g.AllowLoopback {
			return ""
		}
		return "resolves to a loopback address (" + a.String() + ")"
	case a.IsUnspecified():
		return "resolves to an unspecified address (" + a.String() + ")"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "resolves to a link-local address (" + a.String() + ")"
	case a.IsPrivate(), sharedCGNAT.Contains(a):
		return "resolves to a private address (" + a.String() + ")"
	case a.IsMulticast(), a.IsInterfaceLocalMulticast():
		return "resolves to a multicast address (" + a.String() + ")"
	}
	return ""
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
