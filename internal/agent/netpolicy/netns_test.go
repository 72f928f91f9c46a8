package netpolicy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/netns"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// The tests below build a host in network namespaces: a "host" namespace
// with a bridge br0 holding the gateway address 10.77.0.1/24, guests
// (each its own namespace) on veth pairs whose host end plays the tap, and
// an "outside" namespace the host routes to (10.88.0.0/24), standing for
// the world beyond the gateway. They need root, ip(8) and nf_tables, and no
// QEMU, so they run wherever those are and skip with the reason elsewhere.

const gatewayIP = "10.77.0.1"

var guests = map[string]struct{ ip, mac string }{
	"a1": {"10.77.0.11", "02:00:00:00:00:11"},
	"a2": {"10.77.0.12", "02:00:00:00:00:12"},
	"b1": {"10.77.0.13", "02:00:00:00:00:13"},
}

const outsideIP = "10.88.0.2"

var (
	pingID    atomic.Uint32
	probeOnce sync.Once
	probeSkip string
)

// needNetns skips unless this machine can run the namespace tests.
func needNetns(t testing.TB) {
	t.Helper()
	probeOnce.Do(func() {
		if os.Geteuid() != 0 {
			probeSkip = "needs root (network namespaces and nf_tables)"
			return
		}
		if _, err := exec.LookPath("ip"); err != nil {
			probeSkip = "needs ip(8) from iproute2"
			return
		}
		name := "bcnp-probe-" + randHex(4)
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			probeSkip = fmt.Sprintf("cannot create a network namespace: %v: %s", err, out)
			return
		}
		defer exec.Command("ip", "netns", "del", name).Run()
		if err := New(Config{NetNS: name}).Reason(context.Background()); err != nil {
			probeSkip = fmt.Sprintf("nf_tables is not usable in a network namespace here: %v", err)
		}
	})
	if probeSkip != "" {
		t.Skip(probeSkip)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// topo is one test's host, guests and outside world.
type topo struct {
	t      *testing.T
	host   string
	out    string
	guests map[string]string // guest -> namespace
	p      *Policy
}

func run(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	require.NoError(t, err, "%s: %s", strings.Join(args, " "), out)
}

func newTopo(t *testing.T) *topo {
	t.Helper()
	needNetns(t)
	id := randHex(3)
	tp := &topo{t: t, host: "bcnp-" + id + "-host", out: "bcnp-" + id + "-out", guests: map[string]string{}}
	addNS := func(ns string) {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		// No IPv6: its link-local chatter would be dropped (counted) by
		// the policies and blur what the tests count.
		run(t, "ip", "netns", "exec", ns, "sh", "-c",
			"echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6 && echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6")
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	addNS(tp.host)
	run(t, "ip", "netns", "exec", tp.host, "sh", "-c", "echo 1 >/proc/sys/net/ipv4/ip_forward")
	run(t, "ip", "-n", tp.host, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", tp.host, "addr", "add", gatewayIP+"/24", "dev", "br0")
	run(t, "ip", "-n", tp.host, "link", "set", "br0", "up")
	for g, a := range guests {
		ns := "bcnp-" + id + "-" + g
		tp.guests[g] = ns
		addNS(ns)
		run(t, "ip", "-n", tp.host, "link", "add", g, "type", "veth", "peer", "name", "eth0", "netns", ns)
		run(t, "ip", "-n", tp.host, "link", "set", g, "master", "br0", "up")
		run(t, "ip", "-n", ns, "link", "set", "eth0", "address", a.mac)
		run(t, "ip", "-n", ns, "addr", "add", a.ip+"/24", "dev", "eth0")
		run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
		run(t, "ip", "-n", ns, "route", "add", "default", "via", gatewayIP)
	}
	addNS(tp.out)
	run(t, "ip", "-n", tp.host, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", tp.out)
	run(t, "ip", "-n", tp.host, "addr", "add", "10.88.0.1/24", "dev", "up0")
	run(t, "ip", "-n", tp.host, "link", "set", "up0", "up")
	run(t, "ip", "-n", tp.out, "addr", "add", outsideIP+"/24", "dev", "eth0")
	run(t, "ip", "-n", tp.out, "link", "set", "eth0", "up")
	run(t, "ip", "-n", tp.out, "route", "add", "default", "via", "10.88.0.1")
	tp.p = New(Config{NetNS: tp.host})
	return tp
}

// ns is the namespace of a guest, "gw" (the host) or "out".
func (tp *topo) ns(who string) string {
	switch who {
	case "gw":
		return tp.host
	case "out":
		return tp.out
	}
	ns, ok := tp.guests[who]
	require.True(tp.t, ok, "no guest %q", who)
	return ns
}

func addrOf(who string) string {
	switch who {
	case "gw":
		return gatewayIP
	case "out":
		return outsideIP
	}
	return guests[who].ip
}

// rule is the Rule for guest g under policy with its peers.
func (tp *topo) rule(g, policy string, peers ...string) vmcmd.Rule {
	r := vmcmd.Rule{NetNS: tp.host, Bridge: "br0", Tap: g, MAC: guests[g].mac, Address: guests[g].ip,
		Gateway: gatewayIP, Policy: policy}
	for _, p := range peers {
		r.Peers = append(r.Peers, guests[p].ip)
	}
	return r
}

func (tp *topo) apply(g, policy string, peers ...string) {
	tp.t.Helper()
	require.NoError(tp.t, tp.p.Apply(context.Background(), tp.rule(g, policy, peers...)))
}

// listen serves TCP on who's address:port, accepting and closing.
func (tp *topo) listen(who string, port int) {
	tp.t.Helper()
	var l net.Listener
	require.NoError(tp.t, netns.Do(tp.ns(who), func() (err error) {
		l, err = net.Listen("tcp", net.JoinHostPort(addrOf(who), strconv.Itoa(port)))
		return err
	}))
	tp.t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// serveUDP answers every datagram to who's address:port with its payload.
func (tp *topo) serveUDP(who string, port int) {
	tp.t.Helper()
	var c net.PacketConn
	require.NoError(tp.t, netns.Do(tp.ns(who), func() (err error) {
		c, err = net.ListenPacket("udp4", net.JoinHostPort(addrOf(who), strconv.Itoa(port)))
		return err
	}))
	tp.t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteTo(buf[:n], from)
		}
	}()
}

// askUDP sends one datagram from who to to:port and waits for the echo.
func (tp *topo) askUDP(ctx context.Context, who, to string, port int) error {
	var c net.Conn
	if err := netns.Do(tp.ns(who), func() (err error) {
		c, err = net.Dial("udp4", net.JoinHostPort(addrOf(to), strconv.Itoa(port)))
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := c.Write([]byte("q")); err != nil {
		return err
	}
	_, err := c.Read(make([]byte, 16))
	return err
}

// dial connects from who (from the source address src when set) to
// to:port.
func (tp *topo) dial(ctx context.Context, who, src, to string, port int) error {
	d := net.Dialer{}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	return netns.Do(tp.ns(who), func() error {
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(addrOf(to), strconv.Itoa(port)))
		if err == nil {
			c.Close()
		}
		return err
	})
}

// ping sends one ICMP echo from who to to and waits for its reply (until
// ctx ends).
func (tp *topo) ping(ctx context.Context, who, to string) error {
	var c *icmp.PacketConn
	if err := netns.Do(tp.ns(who), func() (err error) {
		c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	id := int(pingID.Add(1) & 0xffff)
	msg, _ := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("bc")}}).Marshal(nil)
	dst := &net.IPAddr{IP: net.ParseIP(addrOf(to))}
	if _, err := c.WriteTo(msg, dst); err != nil {
		return err
	}
	buf := make([]byte, 1500)
	for {
		n, peer, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		m, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply || peer.String() != addrOf(to) {
			continue
		}
		if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id {
			return nil
		}
	}
}

// reaches requires a TCP connection from who to to:port to open.
func (tp *topo) reaches(who, to string, port int) {
	tp.t.Helper()
	require.NoError(tp.t, tp.dial(tp.t.Context(), who, "", to, port), "%s -> %s:%d", who, to, port)
}

// pings requires an ICMP echo from who to to to be answered.
func (tp *topo) pings(who, to string) {
	tp.t.Helper()
	require.NoError(tp.t, tp.ping(tp.t.Context(), who, to), "ping %s -> %s", who, to)
}

// where names a chain: the family's table and the chain's name.
type where struct {
	fam   nftables.TableFamily
	chain string
}

func bridgeChain(name string) where { return where{nftables.TableFamilyBridge, name} }
func inetChain(name string) where   { return where{nftables.TableFamilyINet, name} }

// drops sums the packets counted by the drop rules of a chain.
func (tp *topo) drops(w where) uint64 {
	tp.t.Helper()
	c, release, err := tp.p.conn(tp.host)
	require.NoError(tp.t, err)
	defer release()
	tbl := &nftables.Table{Name: TableName, Family: w.fam}
	rules, err := c.GetRules(tbl, &nftables.Chain{Name: w.chain, Table: tbl})
	require.NoError(tp.t, err, "rules of %s", w.chain)
	var n uint64
	for _, r := range rules {
		var count uint64
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Counter:
				count = e.Packets
			case *expr.Verdict:
				if e.Kind == expr.VerdictDrop {
					n += count
				}
			}
		}
	}
	return n
}

// blockedAt requires what to be dropped by a rule of chain w: it runs what
// until w's drop counter moves, then stops it and requires that it failed.
// No timeout decides: the counter is the evidence.
func (tp *topo) blockedAt(w where, desc string, what func(ctx context.Context) error) {
	tp.t.Helper()
	before := tp.drops(w)
	ctx, cancel := context.WithCancel(tp.t.Context())
	done := make(chan error, 1)
	go func() { done <- what(ctx) }()
	early := false
	bctest.WaitFor(tp.t, desc+" dropped in "+w.chain, func() bool {
		select {
		case err := <-done:
			// Finished before the drop was seen: it must have failed
			// for the drop's sake, which cannot be if it succeeded.
			require.Error(tp.t, err, "%s got through", desc)
			if !early {
				tp.t.Logf("%s ended before its drop was counted: %v", desc, err)
				early = true
			}
			done <- err
		default:
		}
		return tp.drops(w) > before
	})
	cancel()
	require.Error(tp.t, <-done, "%s got through", desc)
}

func (tp *topo) tcpBlockedAt(w where, who, to string, port int) {
	tp.t.Helper()
	tp.blockedAt(w, fmt.Sprintf("%s -> %s:%d", who, to, port), func(ctx context.Context) error {
		return tp.dial(ctx, who, "", to, port)
	})
}

func (tp *topo) pingBlockedAt(w where, who, to string) {
	tp.t.Helper()
	tp.blockedAt(w, fmt.Sprintf("ping %s -> %s", who, to), func(ctx context.Context) error {
		return tp.ping(ctx, who, to)
	})
}

// ruleset is the text of both tables without counters or handles, to
// compare one state of the kernel with another.
func (tp *topo) ruleset() string {
	tp.t.Helper()
	c, release, err := tp.p.conn(tp.host)
	require.NoError(tp.t, err)
	defer release()
	var b strings.Builder
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyBridge, nftables.TableFamilyINet} {
		chains, err := c.ListChainsOfTableFamily(fam)
		require.NoError(tp.t, err)
		if fam == nftables.TableFamilyBridge && len(chains) > 0 {
			sets, err := c.GetSets(bridgeTable())
			require.NoError(tp.t, err)
			for _, set := range sets {
				els, err := c.GetSetElements(set)
				require.NoError(tp.t, err)
				var entries []string
				for _, e := range els {
					to := fmt.Sprintf("%x", e.Val)
					if e.VerdictData != nil {
						to = e.VerdictData.Chain
					}
					entries = append(entries, strings.TrimRight(string(e.Key), "\x00")+":"+to)
				}
				slices.Sort(entries)
				fmt.Fprintf(&b, "map %s %v\n", set.Name, entries)
			}
		}
		for _, ch := range chains {
			fmt.Fprintf(&b, "%d %s %s\n", fam, ch.Table.Name, ch.Name)
			rules, err := c.GetRules(ch.Table, ch)
			require.NoError(tp.t, err)
			for _, r := range rules {
				for _, e := range r.Exprs {
					if _, ok := e.(*expr.Counter); !ok {
						fmt.Fprintf(&b, " %+v", e)
					}
				}
				fmt.Fprintf(&b, " %q\n", ruleComment(r))
			}
		}
	}
	return b.String()
}

// tables lists the tables in the host namespace.
func (tp *topo) tables() []string {
	tp.t.Helper()
	c, release, err := tp.p.conn(tp.host)
	require.NoError(tp.t, err)
	defer release()
	ts, err := c.ListTables()
	require.NoError(tp.t, err)
	var names []string
	for _, t := range ts {
		names = append(names, fmt.Sprintf("%d/%s", t.Family, t.Name))
	}
	return names
}
