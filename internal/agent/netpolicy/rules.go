package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/internal/vmcmd"
)

// Ether types and ports the rules name.
const (
	etherIPv4 = 0x0800
	etherARP  = 0x0806
	portSSH   = 22
	portDNS   = 53
	portDHCPs = 67
	portDHCPc = 68
)

var broadcast4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// Base chains, by family and hook.
const (
	chainPrerouting = "prerouting"
	chainForward    = "forward"
	chainInput      = "input"
	chainOutput     = "output"
)

// Per-tap chains of the bridge table.
func chainGuard(tap string) string { return "guard-" + tap }
func chainFrom(tap string) string  { return "from-" + tap }
func chainTo(tap string) string    { return "to-" + tap }
func chainHost(tap string) string  { return "host-" + tap }

func bridgeTable() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyBridge}
}

func inetTable() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
}

// baseChain is a filter chain on hook with policy accept: traffic of ports
// and addresses this package does not manage passes untouched.
func baseChain(t *nftables.Table, name string, hook *nftables.ChainHook) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: name, Table: t, Type: nftables.ChainTypeFilter, Hooknum: hook,
		Priority: nftables.ChainPriorityFilter, Policy: &accept}
}

func bridgeBase(t *nftables.Table) []*nftables.Chain {
	return []*nftables.Chain{
		baseChain(t, chainPrerouting, nftables.ChainHookPrerouting),
		baseChain(t, chainForward, nftables.ChainHookForward),
		baseChain(t, chainInput, nftables.ChainHookInput),
		baseChain(t, chainOutput, nftables.ChainHookOutput),
	}
}

func inetBase(t *nftables.Table) []*nftables.Chain {
	return []*nftables.Chain{
		baseChain(t, chainForward, nftables.ChainHookForward),
		baseChain(t, chainInput, nftables.ChainHookInput),
	}
}

// tag marks the rules of one tap in shared chains (as an nft comment, so
// `nft list ruleset` shows it), which is how Apply and Remove find them.
func tag(tap string) string { return "bc tap " + tap }

func comment(s string) []byte { return userdata.AppendString(nil, userdata.TypeComment, s) }

func ruleComment(r *nftables.Rule) string {
	s, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	return s
}

// Expression builders. Every match loads into register 1 and compares.

func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func cmp(op expr.CmpOp, data []byte) *expr.Cmp { return &expr.Cmp{Op: op, Register: 1, Data: data} }

func load(base expr.PayloadBase, offset, n uint32) *expr.Payload {
	return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: base, Offset: offset, Len: n}
}

func meta(key expr.MetaKey, op expr.CmpOp, data []byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, cmp(op, data)}
}

func iif(n string) []expr.Any { return meta(expr.MetaKeyIIFNAME, expr.CmpOpEq, ifname(n)) }
func oif(n string) []expr.Any { return meta(expr.MetaKeyOIFNAME, expr.CmpOpEq, ifname(n)) }

func etherType(op expr.CmpOp, t uint16) []expr.Any {
	return []expr.Any{load(expr.PayloadBaseLLHeader, 12, 2), cmp(op, binaryutil.BigEndian.PutUint16(t))}
}

func etherSaddr(op expr.CmpOp, mac []byte) []expr.Any {
	return []expr.Any{load(expr.PayloadBaseLLHeader, 6, 6), cmp(op, mac)}
}

func ipSaddr(op expr.CmpOp, a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{load(expr.PayloadBaseNetworkHeader, 12, 4), cmp(op, b[:])}
}

func ipDaddr(op expr.CmpOp, a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{load(expr.PayloadBaseNetworkHeader, 16, 4), cmp(op, b[:])}
}

func l4(proto byte) []expr.Any { return meta(expr.MetaKeyL4PROTO, expr.CmpOpEq, []byte{proto}) }

func sport(proto byte, port uint16) []expr.Any {
	return append(l4(proto), load(expr.PayloadBaseTransportHeader, 0, 2), cmp(expr.CmpOpEq, binaryutil.BigEndian.PutUint16(port)))
}

func dport(proto byte, port uint16) []expr.Any {
	return append(l4(proto), load(expr.PayloadBaseTransportHeader, 2, 2), cmp(expr.CmpOpEq, binaryutil.BigEndian.PutUint16(port)))
}

// tcpNotSyn matches TCP segments that cannot open a connection (anything
// but a bare SYN): the stateless stand-in for "a reply" where the bridge
// has no conntrack.
func tcpNotSyn() []expr.Any {
	return append(l4(unix.IPPROTO_TCP),
		load(expr.PayloadBaseTransportHeader, 13, 1),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x12}, Xor: []byte{0}},
		cmp(expr.CmpOpNeq, []byte{0x02}))
}

func icmpType(t byte) []expr.Any {
	return append(l4(unix.IPPROTO_ICMP), load(expr.PayloadBaseTransportHeader, 0, 1), cmp(expr.CmpOpEq, []byte{t}))
}

// ctReply matches packets of a connection conntrack has seen both ways
// (or that one relates to), then applies v.
func ctReply(v expr.VerdictKind) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		cmp(expr.CmpOpNeq, binaryutil.NativeEndian.PutUint32(0)),
		&expr.Verdict{Kind: v},
	}
}

// ruleSet collects rules for one chain, and the anonymous sets they
// look up (added to the batch before the rules).
type ruleSet struct {
	table *nftables.Table
	chain *nftables.Chain
	rules []*nftables.Rule
	sets  []anonSet
}

// setIDs numbers anonymous sets; IDs only need to be unique within a
// batch, and start far above the library's own counter.
var setIDs atomic.Uint32

func init() { setIDs.Store(1 << 24) }

type anonSet struct {
	set   *nftables.Set
	elems []nftables.SetElement
}

// peers returns when the IPv4 address at offset (12: source, 16:
// destination) is one of r's peers: one set lookup however many peers.
func (s *ruleSet) peers(r *rule, offset uint32) {
	if len(r.peers) == 0 {
		return
	}
	// The lookup names the set by the ID it gets in the batch, so the ID
	// is chosen here (the library would choose it only in AddSet);
	// "__set%d" is how the kernel names an anonymous set.
	set := &nftables.Set{Table: s.table, Anonymous: true, Constant: true, KeyType: nftables.TypeIPAddr,
		Name: "__set%d", ID: setIDs.Add(1)}
	var elems []nftables.SetElement
	for _, p := range r.peers {
		a := p.As4()
		elems = append(elems, nftables.SetElement{Key: a[:]})
	}
	s.sets = append(s.sets, anonSet{set, elems})
	s.add(expr.VerdictReturn, "", []expr.Any{load(expr.PayloadBaseNetworkHeader, offset, 4), &expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID}})
}

// add appends a rule of the matches in parts followed by verdict v.
func (s *ruleSet) add(v expr.VerdictKind, note string, parts ...[]expr.Any) {
	var ex []expr.Any
	for _, p := range parts {
		ex = append(ex, p...)
	}
	if v == expr.VerdictDrop {
		// Counted, so an operator (and the tests) can see what a policy
		// refused.
		ex = append(ex, &expr.Counter{})
	}
	ex = append(ex, &expr.Verdict{Kind: v})
	r := &nftables.Rule{Table: s.table, Chain: s.chain, Exprs: ex}
	if note != "" {
		r.UserData = comment(note)
	}
	s.rules = append(s.rules, r)
}

// guardRules run at the bridge's prerouting hook, before the bridge
// learns the frame's source MAC: a frame the guest sends must carry its
// MAC and its IPv4 address (ARP for its own address only), for every
// policy. Dropped later, a spoofed frame would still have taught the
// bridge to send another guest's traffic to this port.
func guardRules(t *nftables.Table, r *rule) *ruleSet {
	s := &ruleSet{table: t, chain: &nftables.Chain{Name: chainGuard(r.tap), Table: t}}
	s.add(expr.VerdictDrop, "spoofed source MAC", etherSaddr(expr.CmpOpNeq, r.mac))
	// ARP: Ethernet/IPv4 only, sender hardware address its own, sender
	// protocol address its own or 0.0.0.0 (an RFC 5227 probe, which
	// updates no cache).
	arp := etherType(expr.CmpOpEq, etherARP)
	s.add(expr.VerdictDrop, "malformed ARP", arp,
		[]expr.Any{load(expr.PayloadBaseNetworkHeader, 0, 6), cmp(expr.CmpOpNeq, []byte{0, 1, 8, 0, 6, 4})})
	s.add(expr.VerdictDrop, "spoofed ARP sender MAC", arp,
		[]expr.Any{load(expr.PayloadBaseNetworkHeader, 8, 6), cmp(expr.CmpOpNeq, r.mac)})
	own, zero := r.addr.As4(), [4]byte{}
	s.add(expr.VerdictDrop, "spoofed ARP sender address", arp,
		[]expr.Any{load(expr.PayloadBaseNetworkHeader, 14, 4), cmp(expr.CmpOpNeq, own[:]), cmp(expr.CmpOpNeq, zero[:])})
	s.add(expr.VerdictReturn, "", arp)
	// IPv4 only: IPv6 (link-local included) would go around the address
	// checks, and guest networks are IPv4.
	s.add(expr.VerdictDrop, "not IPv4 or ARP", etherType(expr.CmpOpNeq, etherIPv4))
	if r.policy != vmcmd.PolicyNone {
		// A DHCP client before it has an address.
		s.add(expr.VerdictReturn, "", ipSaddr(expr.CmpOpEq, netip.IPv4Unspecified()), ipDaddr(expr.CmpOpEq, broadcast4),
			sport(unix.IPPROTO_UDP, portDHCPc), dport(unix.IPPROTO_UDP, portDHCPs))
	}
	s.add(expr.VerdictDrop, "spoofed source address", ipSaddr(expr.CmpOpNeq, r.addr))
	return s
}

// fromRules is what the guest may send (forward and input hooks), its
// frames having passed guardRules.
func fromRules(t *nftables.Table, r *rule) *ruleSet {
	s := &ruleSet{table: t, chain: &nftables.Chain{Name: chainFrom(r.tap), Table: t}}
	switch r.policy {
	case vmcmd.PolicyEgress:
		// Anything; what the receiver accepts is its own chain's say.
	case vmcmd.PolicyPrivate:
		s.add(expr.VerdictReturn, "", etherType(expr.CmpOpEq, etherARP))
		s.peers(r, 16) // ip daddr
		gw := ipDaddr(expr.CmpOpEq, r.gateway)
		s.add(expr.VerdictReturn, "", ipDaddr(expr.CmpOpEq, broadcast4), dport(unix.IPPROTO_UDP, portDHCPs))
		s.add(expr.VerdictReturn, "", gw, dport(unix.IPPROTO_UDP, portDHCPs))
		s.add(expr.VerdictReturn, "", gw, dport(unix.IPPROTO_UDP, portDNS))
		s.add(expr.VerdictReturn, "", gw, dport(unix.IPPROTO_TCP, portDNS))
		s.add(expr.VerdictReturn, "", gw, sport(unix.IPPROTO_TCP, portSSH))
		s.add(expr.VerdictDrop, "policy private", nil)
	case vmcmd.PolicyNone:
		s.add(expr.VerdictReturn, "", etherType(expr.CmpOpEq, etherARP))
		s.add(expr.VerdictReturn, "", ipDaddr(expr.CmpOpEq, r.gateway), sport(unix.IPPROTO_TCP, portSSH))
		s.add(expr.VerdictDrop, "policy none", nil)
	}
	return s
}

// toRules is what other bridge ports (other guests) may send the guest.
func toRules(t *nftables.Table, r *rule) *ruleSet {
	s := &ruleSet{table: t, chain: &nftables.Chain{Name: chainTo(r.tap), Table: t}}
	if r.policy == vmcmd.PolicyNone {
		s.add(expr.VerdictDrop, "policy none", nil)
		return s
	}
	// ARP is needed to be reached at all; a sender's ARP is checked on its
	// own port.
	s.add(expr.VerdictReturn, "", etherType(expr.CmpOpEq, etherARP))
	s.add(expr.VerdictDrop, "not IPv4 or ARP", etherType(expr.CmpOpNeq, etherIPv4))
	s.peers(r, 12) // ip saddr
	if r.policy == vmcmd.PolicyEgress {
		// Replies to the guest's own connections to other guests, judged
		// without conntrack: TCP that is not a bare SYN, ICMP errors and
		// echo replies.
		s.add(expr.VerdictReturn, "", tcpNotSyn())
		for _, typ := range []byte{0, 3, 11} { // echo reply, unreachable, time exceeded
			s.add(expr.VerdictReturn, "", icmpType(typ))
		}
	}
	s.add(expr.VerdictDrop, "policy "+r.policy, nil)
	return s
}

// hostRules is what the host (its own sockets, or traffic it routes) may
// send the guest. Routed traffic to an egress guest is judged statefully
// in the inet table.
func hostRules(t *nftables.Table, r *rule) *ruleSet {
	s := &ruleSet{table: t, chain: &nftables.Chain{Name: chainHost(r.tap), Table: t}}
	s.add(expr.VerdictReturn, "", etherType(expr.CmpOpEq, etherARP))
	s.add(expr.VerdictDrop, "not IPv4 or ARP", etherType(expr.CmpOpNeq, etherIPv4))
	if r.policy == vmcmd.PolicyEgress {
		return s
	}
	gw := ipSaddr(expr.CmpOpEq, r.gateway)
	s.add(expr.VerdictReturn, "", gw, dport(unix.IPPROTO_TCP, portSSH))
	if r.policy == vmcmd.PolicyPrivate {
		s.add(expr.VerdictReturn, "", gw, sport(unix.IPPROTO_UDP, portDHCPs))
		s.add(expr.VerdictReturn, "", gw, sport(unix.IPPROTO_UDP, portDNS))
		s.add(expr.VerdictReturn, "", gw, sport(unix.IPPROTO_TCP, portDNS))
	}
	s.add(expr.VerdictDrop, "policy "+r.policy, nil)
	return s
}

// Verdict maps of the bridge table: a tap's name to a jump to one of its
// chains, so a frame finds its port's chain in one lookup however many
// guests the host runs.
const (
	mapGuard = "guard"
	mapFrom  = "from"
	mapTo    = "to"
	mapHost  = "host"
)

func tapMap(t *nftables.Table, name string) *nftables.Set {
	// Host byte order is how nft(8) stores ifname keys; with it `nft list`
	// shows the names.
	return &nftables.Set{Table: t, Name: name, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict,
		KeyByteOrder: binaryutil.NativeEndian}
}

// vmap looks the input (iif) or output (oif) device up in set and
// jumps where it says; a device not in it falls through.
func vmap(key expr.MetaKey, set *nftables.Set) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: set.Name, SetID: set.ID}}
}

// dispatch creates the bridge table's maps and the base-chain rules that
// consult them: written once, with the table.
// addSetMu serialises AddSet: google/nftables v0.3.0 reads and writes an
// unguarded package counter there, so two Policies building batches at
// once race on it.
var addSetMu sync.Mutex

func addSet(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement) error {
	addSetMu.Lock()
	defer addSetMu.Unlock()
	return c.AddSet(s, elems)
}

func dispatch(c *nftables.Conn, t *nftables.Table) error {
	sets := map[string]*nftables.Set{}
	for _, name := range []string{mapGuard, mapFrom, mapTo, mapHost} {
		sets[name] = tapMap(t, name)
		if err := addSet(c, sets[name], nil); err != nil {
			return fmt.Errorf("netpolicy: map %s: %w", name, err)
		}
	}
	base := func(chain string) *nftables.Chain { return &nftables.Chain{Name: chain, Table: t} }
	for _, r := range []struct {
		chain string
		key   expr.MetaKey
		set   string
	}{
		{chainPrerouting, expr.MetaKeyIIFNAME, mapGuard},
		{chainForward, expr.MetaKeyIIFNAME, mapFrom},
		{chainForward, expr.MetaKeyOIFNAME, mapTo},
		{chainInput, expr.MetaKeyIIFNAME, mapFrom},
		{chainOutput, expr.MetaKeyOIFNAME, mapHost},
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: base(r.chain), Exprs: vmap(r.key, sets[r.set])})
	}
	return nil
}

// tapElements are the tap's entries in the maps, by map.
func tapElements(tap string) map[string][]nftables.SetElement {
	el := func(chain string) []nftables.SetElement {
		return []nftables.SetElement{{Key: ifname(tap), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}}
	}
	return map[string][]nftables.SetElement{
		mapGuard: el(chainGuard(tap)),
		mapFrom:  el(chainFrom(tap)),
		mapTo:    el(chainTo(tap)),
		mapHost:  el(chainHost(tap)),
	}
}

// inetRules are the tap's rules in the inet table, keyed by the guest's
// address on its bridge, where conntrack is available. They judge only
// routed traffic (one side not the bridge): where br_netfilter is loaded
// (Docker loads it) bridged frames also pass the inet forward hook, with
// the bridge as both input and output device, and those are the bridge
// table's to judge.
func inetRules(t *nftables.Table, r *rule) []*nftables.Rule {
	in := &ruleSet{table: t, chain: &nftables.Chain{Name: chainInput, Table: t}}
	fwd := &ruleSet{table: t, chain: &nftables.Chain{Name: chainForward, Table: t}}
	note := tag(r.tap)
	// The inet family sees IPv6 too: match IPv4 before reading addresses.
	ipv4 := meta(expr.MetaKeyNFPROTO, expr.CmpOpEq, []byte{unix.NFPROTO_IPV4})
	br := ifname(r.bridge)
	fromGuest := slices.Concat(iif(r.bridge), ipv4, ipSaddr(expr.CmpOpEq, r.addr))
	routedOut := slices.Concat(iif(r.bridge), meta(expr.MetaKeyOIFNAME, expr.CmpOpNeq, br), ipv4, ipSaddr(expr.CmpOpEq, r.addr))
	routedIn := slices.Concat(meta(expr.MetaKeyIIFNAME, expr.CmpOpNeq, br), oif(r.bridge), ipv4, ipDaddr(expr.CmpOpEq, r.addr))
	switch r.policy {
	case vmcmd.PolicyEgress:
		// Routed in: only replies to what the guest opened.
		fwd.add(expr.VerdictAccept, note, routedIn, ctReply(expr.VerdictAccept)[:3])
		fwd.add(expr.VerdictDrop, note, routedIn)
	default:
		// The host answers; a private guest may also ask it for DHCP and
		// DNS. Nothing is routed to or from it.
		in.add(expr.VerdictAccept, note, fromGuest, ctReply(expr.VerdictAccept)[:3])
		if r.policy == vmcmd.PolicyPrivate {
			gw := ipDaddr(expr.CmpOpEq, r.gateway)
			in.add(expr.VerdictAccept, note, fromGuest, gw, dport(unix.IPPROTO_UDP, portDHCPs))
			in.add(expr.VerdictAccept, note, fromGuest, gw, dport(unix.IPPROTO_UDP, portDNS))
			in.add(expr.VerdictAccept, note, fromGuest, gw, dport(unix.IPPROTO_TCP, portDNS))
		}
		in.add(expr.VerdictDrop, note, fromGuest)
		fwd.add(expr.VerdictDrop, note, routedOut)
		fwd.add(expr.VerdictDrop, note, routedIn)
	}
	return append(in.rules, fwd.rules...)
}
