package pxe

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
)

// machines is the tests' Decider: a table from MAC to boot decision. It
// records every request so tests can see what the server asked.
type machines struct {
	mu    sync.Mutex
	boots map[string]Boot
	asked []Request
}

func (m *machines) set(mac string, b Boot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.boots[mac] = b
}

func (m *machines) Decide(_ context.Context, req Request) (Boot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.asked = append(m.asked, req)
	if b, ok := m.boots[req.MAC.String()]; ok {
		return b, nil
	}
	return Unknown{}, nil
}

// logBuffer collects the server's log lines so tests can check what was (and
// was not) logged.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

type fixture struct {
	srv      *Server
	machines *machines
	logs     *logBuffer
	web      string // http://<bound HTTP address>
	bootDir  string
	chain    []byte // undionly.kpxe's content
}

const (
	macA = "52:54:00:00:00:0a"
	macB = "52:54:00:00:00:0b"
	macC = "52:54:00:00:00:0c"
)

// setup starts a server on loopback high ports. tweak adjusts the config.
func setup(t *testing.T, mode Mode, tweak func(*Config)) *fixture {
	t.Helper()
	bootDir := t.TempDir()
	chain := make([]byte, 70_000) // several TFTP blocks
	_, _ = rand.Read(chain)
	require.NoError(t, os.WriteFile(filepath.Join(bootDir, "undionly.kpxe"), chain, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(bootDir, "ipxe.efi"), []byte("efi binary"), 0o644))
	// A file beside the binaries that TFTP must still refuse.
	require.NoError(t, os.WriteFile(filepath.Join(bootDir, "notes.txt"), []byte("not for tftp"), 0o644))

	m := &machines{boots: map[string]Boot{}}
	logs := &logBuffer{}
	cfg := Config{
		Mode:       mode,
		ServerIP:   netip.MustParseAddr("10.99.0.1"),
		DHCPAddr:   "127.0.0.1:0",
		ProxyAddr:  "127.0.0.1:0",
		TFTPAddr:   "127.0.0.1:0",
		HTTPAddr:   "127.0.0.1:0",
		Subnet:     netip.MustParsePrefix("10.99.0.0/24"),
		RangeStart: netip.MustParseAddr("10.99.0.10"),
		RangeEnd:   netip.MustParseAddr("10.99.0.40"),
		Router:     netip.MustParseAddr("10.99.0.254"),
		DNS:        []netip.Addr{netip.MustParseAddr("10.99.0.53")},
		LeaseTime:  2 * time.Hour,
		BootDir:    bootDir,
		Decider:    m,
		Logger:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, srv.Start(t.Context()))
	t.Cleanup(func() { _ = srv.Close() })
	return &fixture{srv: srv, web: "http://" + srv.HTTPAddr().String(), machines: m, logs: logs, bootDir: bootDir, chain: chain}
}

// dhcpClient speaks DHCP to the server over a UDP socket on loopback: the
// packets are the library's own, built as a PXE ROM or iPXE builds them.
type dhcpClient struct {
	t    *testing.T
	conn *net.UDPConn
	to   *net.UDPAddr
}

func newDHCPClient(t *testing.T, to net.Addr) *dhcpClient {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &dhcpClient{t: t, conn: conn, to: to.(*net.UDPAddr)}
}

func (c *dhcpClient) send(m *dhcpv4.DHCPv4) {
	c.t.Helper()
	_, err := c.conn.WriteToUDP(m.ToBytes(), c.to)
	require.NoError(c.t, err)
}

// recv waits for the next reply; the bound is the test's deadline.
func (c *dhcpClient) recv() *dhcpv4.DHCPv4 {
	c.t.Helper()
	if d, ok := c.t.Deadline(); ok {
		_ = c.conn.SetReadDeadline(d)
	}
	buf := make([]byte, 1500)
	n, _, err := c.conn.ReadFromUDP(buf)
	require.NoError(c.t, err)
	m, err := dhcpv4.FromBytes(buf[:n])
	require.NoError(c.t, err)
	return m
}

func (c *dhcpClient) exchange(m *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	c.t.Helper()
	c.send(m)
	r := c.recv()
	require.Equal(c.t, m.TransactionID, r.TransactionID, "reply to another transaction")
	return r
}

func hw(t *testing.T, s string) net.HardwareAddr {
	t.Helper()
	h, err := net.ParseMAC(s)
	require.NoError(t, err)
	return h
}

// pxeROM are the options a BIOS or UEFI PXE ROM sends.
func pxeROM(arch iana.Arch) []dhcpv4.Modifier {
	return []dhcpv4.Modifier{
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(arch)),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, append([]byte{0}, bytes.Repeat([]byte{7}, 16)...)),
	}
}

// ipxe are the options the chainloaded iPXE sends (user class "iPXE").
func ipxe(arch iana.Arch) []dhcpv4.Modifier {
	return append(pxeROM(arch), dhcpv4.WithUserClass("iPXE", false))
}

func discover(t *testing.T, mac string, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	m, err := dhcpv4.NewDiscovery(hw(t, mac), mods...)
	require.NoError(t, err)
	return m
}

func request(t *testing.T, offer *dhcpv4.DHCPv4, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	m, err := dhcpv4.NewRequestFromOffer(offer, mods...)
	require.NoError(t, err)
	return m
}

func ip(s string) net.IP { return net.ParseIP(s).To4() }

func TestFullDHCPHandshakeGivesAddressOptionsAndChainload(t *testing.T) {
	t.Parallel()
	f := setup(t, ModeFull, nil)
	f.machines.set(macA, Ramdisk{Kernel: "http://10.99.0.1/k", Cmdline: "console=ttyS0"})
	c := newDHCPClient(t, f.srv.DHCPAddr())

	offer := c.exchange(discover(t, macA, pxeROM(iana.INTEL_X86PC)...))
	require.Equal(t, dhcpv4.MessageTypeOffer, offer.MessageType())
	require.Equal(t, ip("10.99.0.10"), offer.YourIPAddr.To4(), "lowest address of the range")
	require.Equal(t, ip("10.99.0.1"), offer.ServerIdentifier().To4())
	require.Equal(t, net.CIDRMask(24, 32), offer.SubnetMask())
	require.Equal(t, []net.IP{ip("10.99.0.254")}, toV4(offer.Router()))
	require.Equal(t, []net.IP{ip("10.99.0.53")}, toV4(offer.DNS()))
	require.Equal(t, 2*time.Hour, offer.IPAddressLeaseTime(0))
	require.Equal(t, "undionly.kpxe", offer.BootFileName, "a BIOS PXE ROM gets the iPXE chainload binary")
	require.Equal(t, ip("10.99.0.1"), offer.ServerIPAddr.To4(), "next-server")

	ack := c.exchange(request(t, offer, pxeROM(iana.INTEL_X86PC)...))
	require.Equal(t, dhcpv4.MessageTypeAck, ack.MessageType())
	require.Equal(t, ip("10.99.0.10"), ack.YourIPAddr.To4())
	require.Equal(t, "undionly.kpxe", ack.BootFileName)

	l, ok := f.srv.Lease(hw(t, macA))
	require.True(t, ok)
	require.Equal(t, netip.MustParseAddr("10.99.0.10"), l.IP)
	require.Equal(t, LeaseBound, l.State)

	// The chainloaded iPXE asks again, with user class "iPXE": same address,
	// and now its script's URL.
	offer2 := c.exchange(discover(t, macA, ipxe(iana.INTEL_X86PC)...))
	require.Equal(t, ip("10.99.0.10"), offer2.YourIPAddr.To4())
	require.Equal(t, f.srv.BaseURL()+"/boot/"+macA+".ipxe", offer2.BootFileName)

	// UEFI ROMs get the EFI build.
	offerB := c.exchange(discover(t, macB, pxeROM(iana.EFI_X86_64)...))
	require.Empty(t, offerB.BootFileName, "unknown machines get an address and no boot file")
	f.machines.set(macB, LocalDisk{})
	offerB = c.exchange(discover(t, macB, pxeROM(iana.EFI_BC)...))
	require.Equal(t, ip("10.99.0.11"), offerB.YourIPAddr.To4())
	require.Equal(t, "ipxe.efi", offerB.BootFileName)
}

func toV4(ips []net.IP) []net.IP {
	out := make([]net.IP, 0, len(ips))
	for _, i := range ips {
		out = append(out, i.To4())
	}
	return out
}

func TestFullDHCPNeverGivesOneAddressToTwoClients(t *testing.T) {
	t.Parallel()
	f := setup(t, ModeFull, nil)
	const n = 25
	got := make(chan net.IP, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// No require here: FailNow belongs to the test's goroutine.
			a, err := handshake(f.srv.DHCPAddr(), net.HardwareAddr{0x52, 0x54, 0, 1, 0, byte(i)})
			if err != nil {
				errs <- err
				return
			}
			got <- a
		}()
	}
	wg.Wait()
	close(got)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	seen := map[string]bool{}
	for a := range got {
		require.False(t, seen[a.String()], "address %s given twice", a)
		seen[a.String()] = true
	}
	require.Len(t, seen, n)
}

// handshake runs DISCOVER/OFFER/REQUEST/ACK for mac on its own socket and
// returns the acknowledged address.
func handshake(server net.Addr, mac net.HardwareAddr) (net.IP, error) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ex := func(m *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error) {
		if _, err := conn.WriteTo(m.ToBytes(), server); err != nil {
			return nil, err
		}
		buf := make([]byte, 1500)
		n, _, err := conn.ReadFrom(buf)
		if err != nil {
			return nil, err
		}
		return dhcpv4.FromBytes(buf[:n])
	}
	d, err := dhcpv4.NewDiscovery(mac)
	if err != nil {
		return nil, err
	}
	offer, err := ex(d)
	if err != nil {
		return nil, err
	}
	req, err := dhcpv4.NewRequestFromOffer(offer)
	if err != nil {
		return nil, err
	}
	ack, err := ex(req)
	if err != nil {
		return nil, err
	}
	if ack.MessageType() != dhcpv4.MessageTypeAck {
		return nil, fmt.Errorf("%s: got %s", mac, ack.MessageType())
	}
	return ack.YourIPAddr.To4(), nil
}

func TestFullDHCPRequestForAnotherClientsAddressIsRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, ModeFull, nil)
	c := newDHCPClient(t, f.srv.DHCPAddr())
	offerA := c.exchange(discover(t, macA))
	ackA := c.exchange(request(t, offerA))
	require.Equal(t, dhcpv4.MessageTypeAck, ackA.MessageType())

	// B asks (INIT-REBOOT style, no server id) for A's address.
	steal, err := dhcpv4.New(
		dhcpv4.WithHwAddr(hw(t, macB)),
		dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ackA.YourIPAddr)),
	)
	require.NoError(t, err)
	nak := c.exchange(steal)
	require.Equal(t, dhcpv4.MessageTypeNak, nak.MessageType())
	require.Contains(t, nak.Message(), "not available")

	// An address outside the subnet is refused too.
	outside, err := dhcpv4.New(
		dhcpv4.WithHwAddr(hw(t, macB)),
		dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip("192.0.2.7"))),
	)
	require.NoError(t, err)
	require.Equal(t, dhcpv4.MessageTypeNak, c.exchange(outside).MessageType())

	// A renews its own address (ciaddr set, no requested address).
	renew, err := dhcpv4.NewRenewFromAck(ackA)
	require.NoError(t, err)
	require.Equal(t, dhcpv4.MessageTypeAck, c.exchange(renew).MessageType())
	// B cannot renew what it never had.
	renewB, err := dhcpv4.NewRenewFromAck(ackA, dhcpv4.WithHwAddr(hw(t, macB)))
	require.NoError(t, err)
	require.Equal(t, dhcpv4.MessageTypeNak, c.exchange(renewB).MessageType())
}

func TestFullDHCPDeclineQuarantinesAndReleaseFrees(t *testing.T) {
	t.Parallel()
	f := setup(t, ModeFull, nil)
	c := newDHCPClient(t, f.srv.DHCPAddr())

	offer := c.exchange(discover(t, macA))
	ack := c.exchange(request(t, offer))
	require.Equal(t, ip("10.99.0.10"), ack.YourIPAddr.To4())

	// A finds .10 in use on the wire and declines it.
	decline, err := dhcpv4.New(
		dhcpv4.WithHwAddr(hw(t, macA)),
		dhcpv4.WithMessageType(dhcpv4.MessageTypeDecline),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ack.YourIPAddr)),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(ip("10.99.0.1"))),
	)
	require.NoError(t, err)
	c.send(decline)
	bctest.WaitFor(t, "the decline to be recorded", func() bool {
		_, ok := f.srv.Lease(hw(t, macA))
		return !ok
	})
	// Neither A nor anyone else gets .10 while it is quarantined.
	offerA := c.exchange(discover(t, macA))
	require.Equal(t, ip("10.99.0.11"), offerA.YourIPAddr.To4())
	ackA := c.exchange(request(t, offerA))
	require.Equal(t, dhcpv4.MessageTypeAck, ackA.MessageType())
	offerB := c.exchange(discover(t, macB))
	require.Equal(t, ip("10.99.0.12"), offerB.YourIPAddr.To4())

	// A releases .11; B's offer of .12 still stands; A comes back to .11.
	rel, err := dhcpv4.NewReleaseFromACK(ackA)
	require.NoError(t, err)
	c.send(rel)
	bctest.WaitFor(t, "the release to be recorded", func() bool {
		_, ok := f.srv.Lease(hw(t, macA))
		return !ok
	})
	require.Equal(t, ip("10.99.0.11"), c.exchange(discover(t, macA)).YourIPAddr.To4(), "a client gets back the address it released")
	// A third client gets the lowest never-used address, not A's.
	require.Equal(t, ip("10.99.0.13"), c.exchange(discover(t, macC)).YourIPAddr.To4())
}

func TestPoolRunsOutCleanlyAndRemembersLeasesInItsStore(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := &MemLeases{}
	start, end := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.3")
	p, err := newPool(ctx, start, end, []netip.Addr{netip.MustParseAddr("10.0.0.2")}, store)
	require.NoError(t, err)
	a, err := p.Offer(ctx, macA, netip.Addr{}, now, time.Minute)
	require.NoError(t, err)
	require.Equal(t, "10.0.0.1", a.String())
	b, err := p.Offer(ctx, macB, netip.Addr{}, now, time.Minute)
	require.NoError(t, err)
	require.Equal(t, "10.0.0.3", b.String(), "the reserved server address is skipped")
	_, err = p.Offer(ctx, macC, netip.Addr{}, now, time.Minute)
	require.ErrorIs(t, err, errNoAddress)
	require.NoError(t, p.Bind(ctx, macA, a, now, time.Hour))

	// B's offer lapses; C gets its address. A's binding holds.
	later := now.Add(2 * time.Minute)
	c, err := p.Offer(ctx, macC, netip.Addr{}, later, time.Minute)
	require.NoError(t, err)
	require.Equal(t, b, c)

	// A new pool on the same store knows A's binding.
	p2, err := newPool(ctx, start, end, nil, store)
	require.NoError(t, err)
	l, ok := p2.Lookup(macA, later)
	require.True(t, ok)
	require.Equal(t, a, l.IP)
}

func TestProxyDHCPAnswersOnlyKnownPXEClientsWithoutAnAddress(t *testing.T) {
	t.Parallel()
	f := setup(t, ModeProxy, nil)
	f.machines.set(macA, Ramdisk{Kernel: "http://10.99.0.1/k"})
	f.machines.set(macB, LocalDisk{})
	c := newDHCPClient(t, f.srv.DHCPAddr())

	// A plain DHCP client (no PXEClient class) and an unknown PXE ROM are the
	// network's DHCP server's business: no answer. The known machine's
	// DISCOVER, sent after them, gets the first reply on the socket.
	c.send(discover(t, macC))
	c.send(discover(t, macC, pxeROM(iana.INTEL_X86PC)...))
	bios := discover(t, macA, pxeROM(iana.INTEL_X86PC)...)
	c.send(bios)
	offer := c.recv()
	require.Equal(t, bios.TransactionID, offer.TransactionID, "only the known PXE client is answered")
	require.Equal(t, dhcpv4.MessageTypeOffer, offer.MessageType())
	require.True(t, offer.YourIPAddr.IsUnspecified(), "proxyDHCP hands out no address")
	require.Equal(t, "PXEClient", offer.ClassIdentifier())
	require.Equal(t, "undionly.kpxe", offer.BootFileName)
	require.Equal(t, ip("10.99.0.1"), offer.ServerIPAddr.To4())
	require.Equal(t, []byte{6, 1, 8, 255}, offer.GetOneOption(dhcpv4.OptionVendorSpecificInformation), "PXE discovery control: boot the file named")
	require.Equal(t, bios.GetOneOption(dhcpv4.OptionClientMachineIdentifier), offer.GetOneOption(dhcpv4.OptionClientMachineIdentifier))
	require.Nil(t, offer.GetOneOption(dhcpv4.OptionIPAddressLeaseTime))

	// UEFI: the file, no discovery control; the ROM then asks on 4011.
	efi := c.exchange(discover(t, macB, pxeROM(iana.EFI_X86_64)...))
	require.Equal(t, "ipxe.efi", efi.BootFileName)
	require.Nil(t, efi.GetOneOption(dhcpv4.OptionVendorSpecificInformation))

	// iPXE gets its script's URL.
	script := c.exchange(discover(t, macA, ipxe(iana.INTEL_X86PC)...))
	require.Equal(t, f.srv.BaseURL()+"/boot/"+macA+".ipxe", script.BootFileName)

	// A REQUEST on port 67 is the real DHCP server's to answer.
	c.send(request(t, efi, pxeROM(iana.EFI_X86_64)...))
	again := discover(t, macB, pxeROM(iana.EFI_X86_64)...)
	c.send(again)
	require.Equal(t, again.TransactionID, c.recv().TransactionID)

	// Port 4011: the UEFI ROM, now holding an address from the network's
	// server, asks for its boot file.
	pc := newDHCPClient(t, f.srv.ProxyAddr())
	req, err := dhcpv4.New(append(pxeROM(iana.EFI_X86_64),
		dhcpv4.WithHwAddr(hw(t, macB)),
		dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithClientIP(ip("192.0.2.50")),
	)...)
	require.NoError(t, err)
	ack := pc.exchange(req)
	require.Equal(t, dhcpv4.MessageTypeAck, ack.MessageType())
	require.Equal(t, "ipxe.efi", ack.BootFileName)
	require.Equal(t, ip("10.99.0.1"), ack.ServerIPAddr.To4())
	require.Equal(t, "PXEClient", ack.ClassIdentifier())

	// The Decider heard the architecture and user class.
	f.machines.mu.Lock()
	defer f.machines.mu.Unlock()
	var sawIPXE bool
	for _, r := range f.machines.asked {
		require.Equal(t, PhaseDHCP, r.Phase)
		if r.MAC.String() == macA && r.UserClass == "iPXE" {
			sawIPXE = true
		}
	}
	require.True(t, sawIPXE)
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base := func() Config {
		return Config{
			Mode: ModeFull, ServerIP: netip.MustParseAddr("10.0.0.1"), BootDir: dir,
			Subnet:     netip.MustParsePrefix("10.0.0.0/24"),
			RangeStart: netip.MustParseAddr("10.0.0.10"), RangeEnd: netip.MustParseAddr("10.0.0.20"),
			Decider: &machines{},
		}
	}
	tests := []struct {
		field string
		edit  func(*Config)
	}{
		{"Mode", func(c *Config) { c.Mode = "relay" }},
		{"ServerIP", func(c *Config) { c.ServerIP = netip.Addr{} }},
		{"ServerIP", func(c *Config) { c.ServerIP = netip.MustParseAddr("10.1.0.1") }},
		{"Decider", func(c *Config) { c.Decider = nil }},
		{"BootDir", func(c *Config) { c.BootDir = filepath.Join(dir, "missing") }},
		{"Chainload", func(c *Config) { c.Chainload = map[uint16]string{0: "../etc/passwd"} }},
		{"Subnet", func(c *Config) { c.Subnet = netip.Prefix{} }},
		{"RangeStart/RangeEnd", func(c *Config) { c.RangeEnd = netip.MustParseAddr("10.0.1.5") }},
		{"RangeEnd", func(c *Config) { c.RangeStart, c.RangeEnd = c.RangeEnd, c.RangeStart }},
		{"Router", func(c *Config) { c.Router = netip.MustParseAddr("192.0.2.1") }},
		{"CacheDir", func(c *Config) { c.Upstream = func(context.Context, string) (io.ReadCloser, error) { return nil, nil } }},
		{"LeaseTime", func(c *Config) { c.LeaseTime = time.Second }},
	}
	for _, tt := range tests {
		c := base()
		tt.edit(&c)
		_, err := New(c)
		var ce *ConfigError
		require.ErrorAs(t, err, &ce, tt.field)
		require.Equal(t, tt.field, ce.Field)
	}
	_, err := New(base())
	require.NoError(t, err)
}

func TestFullDHCPIgnoresRelaysFromOtherSubnets(t *testing.T) {
	t.Parallel()
	f := setup(t, ModeFull, nil)
	c := newDHCPClient(t, f.srv.DHCPAddr())
	c.send(discover(t, macB, dhcpv4.WithGatewayIP(ip("192.0.2.1"))))
	local := discover(t, macA)
	c.send(local)
	offer := c.recv()
	require.Equal(t, local.TransactionID, offer.TransactionID, "the relayed DISCOVER from another subnet is not answered")
	require.Equal(t, ip("10.99.0.10"), offer.YourIPAddr.To4(), "and took no address")
}

func TestStartFailureLeavesNothingListeningAndCloseTwiceIsSafe(t *testing.T) {
	t.Parallel()
	f := setup(t, ModeProxy, nil)
	// A second server whose TFTP port is taken by the first.
	srv, err := New(Config{
		Mode: ModeProxy, ServerIP: netip.MustParseAddr("10.99.0.1"), BootDir: f.bootDir,
		Decider: f.machines, HTTPAddr: "127.0.0.1:0", TFTPAddr: f.srv.TFTPAddr().String(),
		DHCPAddr: "127.0.0.1:0", ProxyAddr: "127.0.0.1:0",
	})
	require.NoError(t, err)
	err = srv.Start(t.Context())
	require.ErrorContains(t, err, "listen tftp")
	_, err = net.Dial("tcp", srv.HTTPAddr().String())
	require.Error(t, err, "the HTTP listener opened before the failure is closed again")
	require.NoError(t, srv.Close())
	require.NoError(t, f.srv.Close())
	require.NoError(t, f.srv.Close())
}
