package bmc

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// Endpoint is a parsed BMC address: what a driver dials, and what the site
// agent checks against the site's networks before any call.
type Endpoint struct {
	Scheme string // "ipmi", "http" or "https"
	Host   string // an IP literal or a DNS name, without brackets
	Port   int
}

// String is the endpoint as the driver uses it: host:port for IPMI, a URL
// without a path for Redfish.
func (e Endpoint) String() string {
	hp := net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
	if e.Scheme == "ipmi" {
		return hp
	}
	return e.Scheme + "://" + hp
}

// ParseAddress checks a BMC address for the named driver. IPMI takes a plain
// host or host:port (port 623 by default). Redfish takes an http:// or
// https:// URL with no user, path, query or fragment, or a plain host[:port]
// meaning https. Anything else (another scheme, credentials in the URL, a
// path that would send requests elsewhere) is refused with ErrInvalidAddress.
func ParseAddress(driver, address string) (Endpoint, error) {
	fail := func(format string, args ...any) (Endpoint, error) {
		return Endpoint{}, &Error{Driver: driver, Address: printable(address), Op: "parse address",
			Kind: ErrInvalidAddress, Detail: fmt.Sprintf(format, args...)}
	}
	if address == "" {
		return fail("the address is empty")
	}
	if strings.ContainsFunc(address, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return fail("the address holds a space or a control character")
	}
	switch driver {
	case "ipmi":
		if strings.Contains(address, "://") {
			return fail("IPMI takes a plain host or host:port, not a URL")
		}
		if strings.ContainsAny(address, "/@?#") {
			return fail("IPMI takes a plain host or host:port (no '/', '@', '?' or '#')")
		}
		host, port, err := splitHostPort(address, 623)
		if err != nil {
			return fail("%v", err)
		}
		return Endpoint{Scheme: "ipmi", Host: host, Port: port}, nil
	case "redfish":
		scheme, rest := "https", address
		if i := strings.Index(address, "://"); i >= 0 {
			scheme, rest = strings.ToLower(address[:i]), address[i+3:]
			if scheme != "http" && scheme != "https" {
				return fail("Redfish takes an http:// or https:// URL, not %s://", scheme)
			}
			u, err := url.Parse(address)
			if err != nil {
				return fail("not a URL: %v", err)
			}
			if u.User != nil {
				return fail("the URL must not carry a user or password (pass credentials separately)")
			}
			if u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(rest, "?#") {
				return fail("the URL must not carry a query or a fragment")
			}
			if u.Path != "" && u.Path != "/" {
				return fail("the URL must not carry a path (the service root is always /redfish/v1)")
			}
			rest = u.Host
		} else if strings.ContainsAny(address, "/@?#") {
			return fail("Redfish takes an http(s) URL or a plain host[:port]")
		}
		def := 443
		if scheme == "http" {
			def = 80
		}
		host, port, err := splitHostPort(rest, def)
		if err != nil {
			return fail("%v", err)
		}
		return Endpoint{Scheme: scheme, Host: host, Port: port}, nil
	default:
		return Endpoint{}, &Error{Driver: driver, Address: printable(address), Op: "parse address",
			Kind: ErrUnsupported, Detail: fmt.Sprintf("unknown driver %q (want one of %v)", driver, Drivers())}
	}
}

// splitHostPort accepts host, host:port, [v6] and [v6]:port.
func splitHostPort(s string, defaultPort int) (string, int, error) {
	host, portText := s, ""
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.Index(s, "]")
		if end < 0 {
			return "", 0, fmt.Errorf("unclosed '[' in %q", s)
		}
		host, portText = s[1:end], s[end+1:]
		if portText != "" {
			p, ok := strings.CutPrefix(portText, ":")
			if !ok {
				return "", 0, fmt.Errorf("unexpected %q after ']'", portText)
			}
			portText = p
		}
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() {
			return "", 0, fmt.Errorf("%q in brackets is not an IPv6 address", host)
		}
	case strings.Count(s, ":") == 1:
		host, portText, _ = strings.Cut(s, ":")
	case strings.Count(s, ":") > 1:
		if _, err := netip.ParseAddr(s); err != nil {
			return "", 0, fmt.Errorf("%q is neither host:port nor an IPv6 address", s)
		}
	}
	port := defaultPort
	if portText != "" {
		p, err := strconv.Atoi(portText)
		if err != nil || p < 1 || p > 65535 {
			return "", 0, fmt.Errorf("port %q is not a number from 1 to 65535", portText)
		}
		port = p
	}
	if host == "" {
		return "", 0, fmt.Errorf("the host is empty")
	}
	if _, err := netip.ParseAddr(host); err != nil && !isDNSName(host) {
		return "", 0, fmt.Errorf("host %q is neither an IP address nor a DNS name", host)
	}
	return host, port, nil
}

// isDNSName: letters, digits and hyphens in dot-separated labels of at most
// 63 characters, no label starting or ending with a hyphen.
func isDNSName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			letterOrDigit := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
			if !letterOrDigit && r != '-' {
				return false
			}
		}
	}
	return true
}

// printable quotes an address for an error when it holds bytes a log line
// should not carry raw, and drops any user:password@ it may have carried.
func printable(address string) string {
	if i := strings.Index(address, "@"); i >= 0 {
		if j := strings.Index(address, "://"); j >= 0 && j < i {
			address = address[:j+3] + "…@" + address[i+1:]
		} else {
			address = "…@" + address[i+1:]
		}
	}
	if strings.ContainsFunc(address, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return strconv.Quote(address)
	}
	return address
}
