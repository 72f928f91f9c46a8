package envelope

import (
	"net/http"
	"net/netip"
	"strings"
)

// HeaderForwardedFor is the header a reverse proxy names the client in.
const HeaderForwardedFor = "X-Forwarded-For"

// ClientAddr is the address of the client a request came from, as the
// audit log records it: the peer's, unless the peer is one of the trusted
// proxies, in which case X-Forwarded-For is read from the right, skipping
// every hop that is itself a trusted proxy; the first one that is not is the
// client. A client cannot put an address in the log by sending the header
// itself: only what trusted proxies appended is read, and an untrusted
// peer's header is ignored. peer is "host:port" or a bare address; "" when
// it is unknown (an in-process call).
func ClientAddr(peer string, h http.Header, trusted []netip.Prefix) string {
	addr, ok := parseAddr(peer)
	if !ok {
		return ""
	}
	if !isTrusted(addr, trusted) {
		return addr.String()
	}
	hops := forwardedHops(h)
	for i := len(hops) - 1; i >= 0; i-- {
		hop, ok := parseAddr(hops[i])
		if !ok {
			// A hop a trusted proxy could not have written: stop at the
			// last address it vouches for.
			return addr.String()
		}
		if !isTrusted(hop, trusted) {
			return hop.String()
		}
		addr = hop
	}
	return addr.String()
}

func forwardedHops(h http.Header) []string {
	var hops []string
	for _, v := range h.Values(HeaderForwardedFor) {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				hops = append(hops, p)
			}
		}
	}
	return hops
}

func parseAddr(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	a, err := netip.ParseAddr(strings.Trim(s, "[]"))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ParseTrustedProxies parses a comma-separated list of CIDRs or addresses
// (an address is its own /32 or /128).
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !strings.Contains(p, "/") {
			a, err := netip.ParseAddr(p)
			if err != nil {
				return nil, err
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		pf, err := netip.ParsePrefix(p)
		if err != nil {
			return nil, err
		}
		out = append(out, pf.Masked())
	}
	return out, nil
}
