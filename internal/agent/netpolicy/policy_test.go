package netpolicy

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/internal/netns"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

func TestEgress(t *testing.T) {
	t.Parallel()
	tp := newTopo(t)
	tp.apply("a1", vmcmd.PolicyEgress, "a2")
	tp.apply("a2", vmcmd.PolicyEgress, "a1")
	tp.apply("b1", vmcmd.PolicyEgress)
	for _, who := range []string{"a1", "a2", "b1", "gw", "out"} {
		tp.listen(who, 8080)
	}

	// The tenant's guests reach each other; the host reaches them and
	// they reach the host and, through it, the world.
	tp.reaches("a1", "a2", 8080)
	tp.pings("a2", "a1")
	tp.reaches("gw", "a1", 8080)
	tp.reaches("a1", "gw", 8080)
	tp.reaches("a1", "out", 8080)
	tp.pings("a1", "out")

	// Another tenant's guest is not let in at b1's port, nor b1 at a1's.
	tp.tcpBlockedAt(bridgeChain(chainTo("b1")), "a1", "b1", 8080)
	tp.pingBlockedAt(bridgeChain(chainTo("b1")), "a1", "b1")
	tp.tcpBlockedAt(bridgeChain(chainTo("a1")), "b1", "a1", 8080)
	// The world gets no connection in: only replies are routed to it.
	tp.tcpBlockedAt(inetChain(chainForward), "out", "a1", 8080)

	// Once b1 counts a1 as a peer, a1 gets in, and b1's replies reach
	// a1 although a1 does not count b1 as one.
	tp.apply("b1", vmcmd.PolicyEgress, "a1")
	tp.reaches("a1", "b1", 8080)
	tp.pings("a1", "b1")
	tp.tcpBlockedAt(bridgeChain(chainTo("a1")), "b1", "a1", 8080)
}

func TestPrivate(t *testing.T) {
	t.Parallel()
	tp := newTopo(t)
	tp.apply("a1", vmcmd.PolicyPrivate, "a2")
	tp.apply("a2", vmcmd.PolicyPrivate, "a1")
	tp.apply("b1", vmcmd.PolicyEgress)
	for _, who := range []string{"a1", "a2", "b1", "gw", "out"} {
		tp.listen(who, 8080)
	}
	tp.listen("gw", 53)
	tp.listen("a1", 22)

	tp.reaches("a1", "a2", 8080)
	tp.reaches("a2", "a1", 8080)
	tp.pings("a1", "a2")
	// DNS on the gateway (UDP and TCP), and the host's exec path to the
	// guest.
	tp.serveUDP("gw", 53)
	tp.serveUDP("gw", 5353)
	require.NoError(t, tp.askUDP(t.Context(), "a1", "gw", 53), "a1 -> gw:53/udp")
	tp.blockedAt(bridgeChain(chainFrom("a1")), "a1 -> gw:5353/udp", func(ctx context.Context) error {
		return tp.askUDP(ctx, "a1", "gw", 5353)
	})
	tp.reaches("a1", "gw", 53)
	tp.reaches("gw", "a1", 22)

	tp.tcpBlockedAt(bridgeChain(chainFrom("a1")), "a1", "b1", 8080)
	tp.tcpBlockedAt(bridgeChain(chainTo("a1")), "b1", "a1", 8080)
	tp.pingBlockedAt(bridgeChain(chainTo("a1")), "b1", "a1")
	tp.tcpBlockedAt(bridgeChain(chainFrom("a1")), "a1", "gw", 8080)
	tp.tcpBlockedAt(bridgeChain(chainFrom("a1")), "a1", "out", 8080)
	tp.pingBlockedAt(bridgeChain(chainFrom("a1")), "a1", "gw")
	tp.tcpBlockedAt(bridgeChain(chainHost("a1")), "gw", "a1", 8080)
	tp.tcpBlockedAt(inetChain(chainForward), "out", "a1", 8080)
}

func TestNone(t *testing.T) {
	t.Parallel()
	tp := newTopo(t)
	tp.apply("a1", vmcmd.PolicyNone)
	tp.apply("a2", vmcmd.PolicyEgress, "a1")
	for _, who := range []string{"a1", "a2", "gw", "out"} {
		tp.listen(who, 8080)
	}
	tp.listen("gw", 53)
	tp.listen("a1", 22)

	// Only the host's exec path.
	tp.reaches("gw", "a1", 22)

	// a2's ARP reply does not reach a1.
	tp.tcpBlockedAt(bridgeChain(chainTo("a1")), "a1", "a2", 8080)
	tp.tcpBlockedAt(bridgeChain(chainFrom("a1")), "a1", "gw", 53)
	tp.tcpBlockedAt(bridgeChain(chainFrom("a1")), "a1", "out", 8080)
	tp.pingBlockedAt(bridgeChain(chainFrom("a1")), "a1", "gw")
	tp.tcpBlockedAt(bridgeChain(chainTo("a1")), "a2", "a1", 8080)
	tp.tcpBlockedAt(bridgeChain(chainHost("a1")), "gw", "a1", 8080)
	tp.pingBlockedAt(bridgeChain(chainHost("a1")), "gw", "a1")
}

// sendARP sends, from who's eth0, an ARP reply claiming ip is at mac.
func (tp *topo) sendARP(who string, mac net.HardwareAddr, ip string) error {
	return netns.Do(tp.ns(who), func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		// AF_PACKET takes the protocol in network byte order.
		proto := binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, unix.ETH_P_ARP))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto))
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		a := netip.MustParseAddr(ip).As4()
		frame := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac...)
		frame = append(frame, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2)
		frame = append(frame, mac...)
		frame = append(frame, a[:]...)
		frame = append(frame, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
		frame = append(frame, a[:]...)
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: ifi.Index, Protocol: proto})
	})
}

func TestSpoofing(t *testing.T) {
	t.Parallel()
	tp := newTopo(t)
	// a2 and b1 are one tenant's guests; a1 another's.
	tp.apply("a1", vmcmd.PolicyPrivate)
	tp.apply("a2", vmcmd.PolicyPrivate, "b1")
	tp.apply("b1", vmcmd.PolicyPrivate, "a2")
	tp.listen("b1", 8080)
	guard := bridgeChain(chainGuard("a1"))

	// a1 takes a2's address to get into b1, which lets a2 in.
	run(t, "ip", "-n", tp.ns("a1"), "addr", "add", guests["a2"].ip+"/32", "dev", "eth0")
	tp.blockedAt(guard, "a1 as a2's address -> b1", func(ctx context.Context) error {
		return tp.dial(ctx, "a1", guests["a2"].ip, "b1", 8080)
	})
	// a1 claims a2's address in ARP.
	a1mac, _ := net.ParseMAC(guests["a1"].mac)
	tp.blockedAt(guard, "a1's ARP for a2's address", func(ctx context.Context) error {
		if err := tp.sendARP("a1", a1mac, guests["a2"].ip); err != nil {
			return err
		}
		<-ctx.Done()
		return errors.New("sent; the drop counter is the evidence")
	})
	run(t, "ip", "-n", tp.ns("a1"), "addr", "del", guests["a2"].ip+"/32", "dev", "eth0")

	// a1 takes a2's MAC as well as its address.
	run(t, "ip", "-n", tp.ns("a1"), "link", "set", "eth0", "address", guests["a2"].mac)
	run(t, "ip", "-n", tp.ns("a1"), "addr", "add", guests["a2"].ip+"/32", "dev", "eth0")
	tp.blockedAt(guard, "a1 as a2 (MAC and address) -> b1", func(ctx context.Context) error {
		return tp.dial(ctx, "a1", guests["a2"].ip, "b1", 8080)
	})
	// a2 itself still gets in: the spoofed frames were dropped before
	// the bridge learned a2's MAC on a1's port.
	tp.reaches("a2", "b1", 8080)
}

func TestRemoveRestoresDefault(t *testing.T) {
	t.Parallel()
	tp := newTopo(t)
	before := tp.ruleset()
	tp.apply("a2", vmcmd.PolicyEgress)
	withA2 := tp.ruleset()
	tp.apply("a1", vmcmd.PolicyNone)
	tp.listen("a1", 8080)
	tp.tcpBlockedAt(bridgeChain(chainTo("a1")), "a2", "a1", 8080)
	tp.tcpBlockedAt(bridgeChain(chainHost("a1")), "gw", "a1", 8080)

	require.NoError(t, tp.p.Remove(context.Background(), "a1"))
	require.Equal(t, withA2, tp.ruleset(), "a1's chains and rules are gone, a2's are kept")
	tp.reaches("a2", "a1", 8080)
	tp.reaches("gw", "a1", 8080)
	require.NoError(t, tp.p.Remove(context.Background(), "a1"), "a second Remove")
	require.NoError(t, tp.p.Remove(context.Background(), "b1"), "a tap never applied")
	require.NoError(t, tp.p.Remove(context.Background(), "a2"))
	require.NotEqual(t, before, tp.ruleset())
	require.NotContains(t, tp.ruleset(), "a2", "no per-tap chain or rule is left")

	// A fresh Policy (bcd restarted) removes a tap it never applied,
	// looking in its configured namespace.
	tp.apply("a1", vmcmd.PolicyPrivate)
	require.NoError(t, New(Config{NetNS: tp.host}).Remove(context.Background(), "a1"))
	require.NotContains(t, tp.ruleset(), "a1")
}

func TestApplyIsIdempotent(t *testing.T) {
	t.Parallel()
	tp := newTopo(t)
	tp.apply("a1", vmcmd.PolicyPrivate, "a2")
	first := tp.ruleset()
	tp.apply("a1", vmcmd.PolicyPrivate, "a2")
	require.Equal(t, first, tp.ruleset())
	// Another policy replaces, never adds to, the tap's rules.
	tp.apply("a1", vmcmd.PolicyEgress)
	tp.apply("a1", vmcmd.PolicyPrivate, "a2")
	require.Equal(t, first, tp.ruleset())
	// A fresh Policy applying the same rule changes nothing either.
	require.NoError(t, New(Config{}).Apply(context.Background(), tp.rule("a1", vmcmd.PolicyPrivate, "a2")))
	require.Equal(t, first, tp.ruleset())
}

func TestBadRuleWritesNothing(t *testing.T) {
	t.Parallel()
	tp := newTopo(t)
	ctx := context.Background()
	require.True(t, tp.p.Supported(ctx))
	require.Empty(t, tp.tables(), "the probe leaves nothing behind")
	bad := tp.rule("a1", "public")
	require.ErrorContains(t, tp.p.Apply(ctx, bad), "policy")
	require.Empty(t, tp.tables(), "nothing was created for a refused rule")

	tp.apply("a1", vmcmd.PolicyPrivate, "a2")
	applied := tp.ruleset()
	for field, edit := range map[string]func(*vmcmd.Rule){
		"mac":      func(r *vmcmd.Rule) { r.MAC = "zz:00:00:00:00:11" },
		"address":  func(r *vmcmd.Rule) { r.Address = "10.77.0" },
		"peers[0]": func(r *vmcmd.Rule) { r.Peers = []string{"a2"} },
		"policy":   func(r *vmcmd.Rule) { r.Policy = "open" },
	} {
		r := tp.rule("a1", vmcmd.PolicyEgress)
		edit(&r)
		var re *RuleError
		require.True(t, errors.As(tp.p.Apply(ctx, r), &re), field)
		require.Equal(t, field, re.Field)
		require.Equal(t, applied, tp.ruleset(), "the refused rule for %s changed nothing", field)
	}

	// A namespace that does not exist fails before any write, too.
	r := tp.rule("a1", vmcmd.PolicyEgress)
	r.NetNS = "bcnp-missing-" + randHex(3)
	require.ErrorContains(t, tp.p.Apply(ctx, r), "network namespace")
	require.Equal(t, applied, tp.ruleset())
}

// A tap applied in another namespace leaves nothing in the old one.
func TestApplyMovesNamespace(t *testing.T) {
	t.Parallel()
	tp := newTopo(t)
	other := tp.host + "2"
	run(t, "ip", "netns", "add", other)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", other).Run() })
	tp.apply("a1", vmcmd.PolicyPrivate)
	require.Contains(t, tp.ruleset(), "from-a1")
	r := tp.rule("a1", vmcmd.PolicyPrivate)
	r.NetNS = other
	require.NoError(t, tp.p.Apply(context.Background(), r))
	require.NotContains(t, tp.ruleset(), "a1")
	moved := &topo{t: t, host: other, p: tp.p}
	require.Contains(t, moved.ruleset(), "from-a1")
	require.NoError(t, tp.p.Remove(context.Background(), "a1"))
	require.NotContains(t, moved.ruleset(), "a1")
}
