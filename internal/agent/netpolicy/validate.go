package netpolicy

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"

	"github.com/better-compute/better-compute/internal/vmcmd"
)

// RuleError is a Rule refused before anything reached the kernel; Field
// names the Rule field (as in its JSON form) so bcd can answer
// vmcmd.FailInvalid with it.
type RuleError struct {
	Field  string
	Reason string
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("netpolicy: invalid rule: %s: %s", e.Field, e.Reason)
}

// ifnameRE is what Linux accepts as an interface name that is also safe as
// a chain name suffix: at most 15 bytes (IFNAMSIZ-1), no '/', ':' or space.
var ifnameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$`)

// netnsRE is a name under /run/netns (ip netns add): one path element.
var netnsRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// rule is a validated Rule in the forms the ruleset needs.
type rule struct {
	netns   string
	bridge  string
	tap     string
	mac     net.HardwareAddr
	addr    netip.Addr
	gateway netip.Addr
	policy  string
	peers   []netip.Addr
}

func bad(field, format string, a ...any) error {
	return &RuleError{Field: field, Reason: fmt.Sprintf(format, a...)}
}

// unicast4 reports whether a is an address a guest or gateway can hold.
func unicast4(a netip.Addr) bool {
	return a.Is4() && !a.IsUnspecified() && !a.IsMulticast() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

// validTap reports whether tap can name a tap device (and so a chain).
func validTap(tap string) error {
	if !ifnameRE.MatchString(tap) {
		return bad("tap", "%q is not an interface name (1-15 letters, digits, _.-)", tap)
	}
	return nil
}

// check validates r; nothing touches the kernel before it passes.
func check(r vmcmd.Rule) (*rule, error) {
	out := &rule{netns: r.NetNS, bridge: r.Bridge, tap: r.Tap, policy: r.Policy}
	if r.NetNS != "" && (!netnsRE.MatchString(r.NetNS) || r.NetNS == "." || r.NetNS == "..") {
		return nil, bad("netns", "%q is not a network namespace name", r.NetNS)
	}
	if !ifnameRE.MatchString(r.Bridge) {
		return nil, bad("bridge", "%q is not an interface name (1-15 letters, digits, _.-)", r.Bridge)
	}
	if err := validTap(r.Tap); err != nil {
		return nil, err
	}
	if r.Tap == r.Bridge {
		return nil, bad("tap", "%q is the bridge itself", r.Tap)
	}
	mac, err := net.ParseMAC(r.MAC)
	if err != nil || len(mac) != 6 {
		return nil, bad("mac", "%q is not an Ethernet address", r.MAC)
	}
	if mac[0]&1 == 1 || [6]byte(mac) == [6]byte{} {
		return nil, bad("mac", "%s is not a unicast address", mac)
	}
	out.mac = mac
	if out.addr, err = netip.ParseAddr(r.Address); err != nil || !unicast4(out.addr) {
		return nil, bad("address", "%q is not a unicast IPv4 address (without prefix)", r.Address)
	}
	if out.gateway, err = netip.ParseAddr(r.Gateway); err != nil || !unicast4(out.gateway) {
		return nil, bad("gateway", "%q is not a unicast IPv4 address", r.Gateway)
	}
	if out.gateway == out.addr {
		return nil, bad("gateway", "%s is the guest's own address", out.gateway)
	}
	switch r.Policy {
	case "":
		out.policy = vmcmd.PolicyEgress
	case vmcmd.PolicyEgress, vmcmd.PolicyPrivate, vmcmd.PolicyNone:
	default:
		return nil, bad("policy", "%q is not one of egress, private, none", r.Policy)
	}
	seen := map[netip.Addr]bool{}
	for i, p := range r.Peers {
		a, err := netip.ParseAddr(p)
		if err != nil || !unicast4(a) {
			return nil, bad(fmt.Sprintf("peers[%d]", i), "%q is not a unicast IPv4 address", p)
		}
		// The guest itself and the gateway have their own rules; a
		// duplicate would only lengthen the chain.
		if a == out.addr || a == out.gateway || seen[a] {
			continue
		}
		seen[a] = true
		out.peers = append(out.peers, a)
	}
	return out, nil
}
