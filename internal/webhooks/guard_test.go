package webhooks_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/webhooks"
)

// How far each guard lets a delivery reach an address.
const (
	reachAll      = iota // every guard allows it
	reachLoopback        // dev's (loopback) and --webhook-allow-private's guards
	reachPrivate         // --webhook-allow-private's guard
	reachNone            // no guard, whatever the flags
)

// TestGuardAddresses: every address class against the three guards
// (strict, dev's loopback, --webhook-allow-private), at dial time (Control)
// and on the URL (CheckURL), with IPv4 addresses carried inside IPv6 ones
// judged by the same rules.
func TestGuardAddresses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr  string
		reach int
		why   string
	}{
		{"93.184.216.34", reachAll, ""},
		{"2606:2800:220:1:248:1893:25c8:1946", reachAll, ""},
		{"127.0.0.1", reachLoopback, "loopback"},
		{"127.9.9.9", reachLoopback, "loopback"},
		{"::1", reachLoopback, "loopback"},
		{"::ffff:127.0.0.1", reachLoopback, "loopback"},
		{"10.1.2.3", reachPrivate, "private"},
		{"172.16.5.4", reachPrivate, "private"},
		{"192.168.0.10", reachPrivate, "private"},
		{"fd12:3456::1", reachPrivate, "private"},
		{"100.64.0.1", reachPrivate, "shared"},
		{"198.18.0.1", reachPrivate, "benchmarking"},
		{"198.19.255.254", reachPrivate, "benchmarking"},
		// Unspecified addresses reach this host.
		{"0.0.0.0", reachNone, "unspecified"},
		{"0.1.2.3", reachNone, "unspecified"},
		{"::", reachNone, "unspecified"},
		{"::ffff:0.0.0.0", reachNone, "unspecified"},
		// Cloud metadata, link-local, multicast and reserved addresses.
		{"169.254.169.254", reachNone, "link-local"},
		{"169.254.170.2", reachNone, "link-local"},
		{"::ffff:169.254.169.254", reachNone, "link-local"},
		{"fe80::1", reachNone, "link-local"},
		{"fe80::1%eth0", reachNone, "link-local"},
		{"fd00:ec2::254", reachNone, "metadata"},
		{"100.100.100.200", reachNone, "metadata"},
		{"168.63.129.16", reachNone, "metadata"},
		{"224.0.0.1", reachNone, "multicast"},
		{"239.255.255.250", reachNone, "multicast"},
		{"ff02::1", reachNone, "multicast"},
		{"ff0e::1", reachNone, "multicast"},
		{"240.0.0.1", reachNone, "reserved"},
		{"255.255.255.255", reachNone, "reserved"},
		{"::7f00:1", reachNone, "reserved"},
		// NAT64 (64:ff9b::/96): the IPv4 address in the last 32 bits.
		{"64:ff9b::5db8:d822", reachAll, ""},
		{"64:ff9b::7f00:1", reachLoopback, "carries a loopback"},
		{"64:ff9b::a01:203", reachPrivate, "carries a private"},
		{"64:ff9b::a9fe:a9fe", reachNone, "carries a link-local"},
		{"64:ff9b::", reachNone, "carries an unspecified"},
		// Local-use NAT64 (64:ff9b:1::/48) is private, and its IPv4 counts.
		{"64:ff9b:1:5db8:d8:2200::", reachPrivate, "local-use NAT64"},
		{"64:ff9b:1:a9fe:a9:fe00::", reachNone, "carries a link-local"},
		// 6to4 (2002::/16): the IPv4 address in bits 16-47.
		{"2002:5db8:d822::1", reachAll, ""},
		{"2002:7f00:1::1", reachLoopback, "carries a loopback"},
		{"2002:a00:1::1", reachPrivate, "carries a private"},
		{"2002:a9fe:a9fe::1", reachNone, "carries a link-local"},
		{"2002:e000:1::1", reachNone, "carries a multicast"},
		// Teredo (2001::/32): the server, and the client stored inverted.
		{"2001:0:5db8:d822::a247:27dd", reachAll, ""},
		{"2001:0:5db8:d822::5601:5601", reachNone, "carries a link-local"},
		{"2001:0:a9fe:a9fe::a247:27dd", reachNone, "carries a link-local"},
	} {
		ap := netip.AddrPortFrom(netip.MustParseAddr(tc.addr), 443).String()
		host := ap[:strings.LastIndex(ap, ":")]
		if z := strings.Index(host, "%"); z >= 0 {
			host = host[:z] + "%25" + host[z+1:]
		}
		for _, g := range []struct {
			name    string
			guard   *webhooks.Guard
			allowed bool
		}{
			{"strict", &webhooks.Guard{}, tc.reach == reachAll},
			{"loopback", &webhooks.Guard{AllowLoopback: true}, tc.reach <= reachLoopback},
			{"private", &webhooks.Guard{AllowPrivate: true}, tc.reach <= reachPrivate},
		} {
			err := g.guard.Control("tcp", ap, nil)
			why := g.guard.CheckURL(context.Background(), "https://"+host+"/hook")
			if g.allowed {
				require.NoError(t, err, "%s guard, %s", g.name, tc.addr)
				require.Empty(t, why, "%s guard, %s", g.name, tc.addr)
				continue
			}
			require.ErrorContains(t, err, tc.why, "%s guard, %s", g.name, tc.addr)
			require.Contains(t, why, tc.why, "%s guard, %s", g.name, tc.addr)
		}
	}
}

// TestGuardSelf: the API's own listener is refused under every flag, also
// through an unspecified address (which lands on loopback) and through an
// IPv4 address carried in IPv6.
func TestGuardSelf(t *testing.T) {
	t.Parallel()
	for _, listen := range []string{"127.0.0.1:8443", "[::1]:8443", ":8443", "10.0.0.5:8443"} {
		g := &webhooks.Guard{AllowPrivate: true}
		g.AddSelf(listen)
		targets := []string{"0.0.0.0:8443", "[::]:8443"}
		if strings.HasPrefix(listen, "10.") {
			targets = []string{"10.0.0.5:8443", "[::ffff:10.0.0.5]:8443", "[64:ff9b::a00:5]:8443", "[2002:a00:5::1]:8443"}
		}
		for _, to := range targets {
			require.ErrorContains(t, g.Control("tcp", to, nil), "own API listener", listen+" → "+to)
		}
		require.NoError(t, g.Control("tcp", "10.9.9.9:8444", nil), "private allowed, another port")
	}
}

// TestAllowPrivateStillRefuses: under --webhook-allow-private, an endpoint
// on the API's own port through an unspecified address, cloud metadata,
// multicast and a NAT64 address carrying metadata are refused with a field
// error on url, and nothing is written; a private address is allowed.
func TestAllowPrivateStillRefuses(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *app.Config) { c.WebhookAllowPrivate = true })
	ctx := context.Background()
	_, port, err := net.SplitHostPort(strings.TrimPrefix(f.cp.URL, "http://"))
	require.NoError(t, err)
	// The platform admin for acme, and another tenant's own admin for it.
	other := f.cp.Client(f.key(t, "other", "admin"))
	for tenant, c := range map[string]*client.Client{"acme": f.admin, "other": other} {
		for _, u := range []string{
			"http://0.0.0.0:" + port + "/v1/hooks", "http://[::]:" + port + "/v1/hooks", "http://0.0.0.0/x",
			"http://169.254.169.254/latest/meta-data", "http://[fd00:ec2::254]/latest/meta-data", "http://224.0.0.1/x",
			"http://[ff02::1]/x", "http://255.255.255.255/x", "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",
			"http://[2002:a9fe:a9fe::1]/latest/meta-data",
		} {
			_, err := c.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: tenant, Url: u}))
			require.Equal(t, "INVALID_ARGUMENT", code(err), u)
			vs := client.Detail(err).GetViolations()
			require.NotEmpty(t, vs, u)
			require.Equal(t, "url", vs[0].GetField(), u)
		}
	}
	var n int
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM webhooks`).Scan(&n)
	}))
	require.Zero(t, n, "nothing written")
	_, err = f.admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: "http://10.1.2.3/x"}))
	require.NoError(t, err)
}

// fakeDNS is a DNS server on loopback that answers every A query with the
// address it holds at the time (and AAAA with nothing).
type fakeDNS struct {
	pc   net.PacketConn
	mu   sync.Mutex
	addr netip.Addr
}

func newFakeDNS(t *testing.T, addr string) *fakeDNS {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(t, err)
	d := &fakeDNS{pc: pc, addr: netip.MustParseAddr(addr)}
	t.Cleanup(func() { _ = pc.Close() })
	go d.serve()
	return d
}

func (d *fakeDNS) set(addr string) { d.mu.Lock(); d.addr = netip.MustParseAddr(addr); d.mu.Unlock() }

func (d *fakeDNS) serve() {
	buf := make([]byte, 512)
	for {
		n, from, err := d.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired})
		_ = b.StartQuestions()
		_ = b.Question(q)
		_ = b.StartAnswers()
		if q.Type == dnsmessage.TypeA {
			d.mu.Lock()
			a := d.addr.As4()
			d.mu.Unlock()
			_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET}, dnsmessage.AResource{A: a})
		}
		msg, err := b.Finish()
		if err == nil {
			_, _ = d.pc.WriteTo(msg, from)
		}
	}
}

// resolver sends every query to the fake server.
func (d *fakeDNS) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "udp4", d.pc.LocalAddr().String())
	}}
}

// TestDeliveryDialIsGuarded: a host name that resolved to a public address
// when its endpoint was created and to loopback when a delivery dials (DNS
// rebinding) is refused at the connection, after resolution: the attempt
// fails naming the address, and the receiver on loopback gets nothing.
func TestDeliveryDialIsGuarded(t *testing.T) {
	t.Parallel()
	dns := newFakeDNS(t, "93.184.216.34")
	f := setup(t, func(c *app.Config) { c.WebhookAllowLoopback, c.WebhookResolver = false, dns.resolver() })
	ctx := context.Background()
	rcv := newReceiver(t, f.cp.Clock)
	_, port, err := net.SplitHostPort(rcv.srv.Listener.Addr().String())
	require.NoError(t, err)
	// Only the test event is sent, so no delivery dials before the name
	// moves.
	wh, secret := f.create(t, "http://hooks.example.test:"+port+"/hook", "webhook.test")
	rcv.setSecret(secret)

	dns.set("127.0.0.1")
	_, err = f.admin.Webhooks.Test(ctx, connect.NewRequest(&apiv1.TestWebhookRequest{Tenant: "acme", Webhook: wh.GetId()}))
	require.NoError(t, err)
	var last string
	bctest.WaitFor(t, "a refused attempt", func() bool {
		dl, err := f.admin.Webhooks.ListDeliveries(ctx, connect.NewRequest(&apiv1.ListWebhookDeliveriesRequest{Tenant: "acme", Webhook: wh.GetId()}))
		require.NoError(t, err)
		for _, d := range dl.Msg.GetDeliveries() {
			if d.GetAttempts() > 0 {
				last = d.GetLastError()
				return true
			}
		}
		return false
	})
	require.Contains(t, last, "127.0.0.1:"+port)
	require.Contains(t, last, "loopback")
	require.Empty(t, rcv.types(), "the receiver got nothing")
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	require.Zero(t, rcv.refused)
}
