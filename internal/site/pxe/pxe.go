// Package pxe runs a site's provisioning-network services: DHCP (a full
// server on a range, or proxyDHCP beside an existing one), TFTP that serves
// only the iPXE chainload binaries, and HTTP for per-machine iPXE scripts and
// the kernels, initrds and images they load (with a content-addressed cache).
//
// Every machine PXE-boots first; a Decider supplied by the site agent says
// per machine whether it boots a ramdisk, its local disk, or nothing. The
// package never talks to a BMC and never serves a file over TFTP that is not
// a configured chainload binary; per-boot secrets handed to it are never
// logged.
package pxe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/pin/tftp/v3"

	"github.com/better-compute/better-compute/internal/clock"
)

// Mode is how the server takes part in DHCP.
type Mode string

const (
	// ModeFull hands out addresses from Config's range and boot options.
	ModeFull Mode = "full"
	// ModeProxy answers only PXE clients, with boot options and no address,
	// beside the network's own DHCP server (port 67 and PXE port 4011).
	ModeProxy Mode = "proxy"
)

// Config configures a Server. Zero values take the defaults noted.
type Config struct {
	Mode Mode // required
	// Interface binds the DHCP sockets to one interface (SO_BINDTODEVICE), so
	// broadcasts go out and come in only on the provisioning network.
	Interface string
	// ServerIP is the address machines reach this server at: DHCP server
	// identifier, TFTP next-server and the host of the script URLs. Required.
	ServerIP netip.Addr

	// Listen addresses. Defaults: DHCP ":67", proxy PXE ":4011" (proxy mode
	// only), TFTP ":69", HTTP ":80". Tests use "127.0.0.1:0".
	DHCPAddr  string
	ProxyAddr string
	TFTPAddr  string
	HTTPAddr  string

	// Full mode: the subnet, the range handed out (inclusive), options.
	Subnet     netip.Prefix
	RangeStart netip.Addr
	RangeEnd   netip.Addr
	Router     netip.Addr   // optional
	DNS        []netip.Addr // optional
	LeaseTime  time.Duration
	// OfferHold is how long an offered address is kept for the client's
	// REQUEST (default 1 minute).
	OfferHold time.Duration
	// Leases records leases (default: MemLeases).
	Leases LeaseStore

	// BootDir holds the iPXE chainload binaries (Debian's ipxe package:
	// /usr/lib/ipxe). Required.
	BootDir string
	// Chainload maps a client architecture (DHCP option 93) to the binary a
	// PXE ROM gets over TFTP. Default: 0 (BIOS) undionly.kpxe, 7 and 9 (UEFI
	// x86-64) ipxe.efi. TFTP serves these names and nothing else.
	Chainload map[uint16]string

	// CacheDir is the content-addressed cache of kernels, initrds and images
	// ("sha256:" references). Required when Upstream is set.
	CacheDir string
	// Upstream fetches a blob by digest on a cache miss.
	Upstream FetchFunc
	// FilesDir serves files by name (references without "sha256:"); optional.
	FilesDir string

	// RetryDelay is how long an unknown machine's script waits before asking
	// again (default 30 s).
	RetryDelay time.Duration

	Decider Decider // required
	Logger  *slog.Logger
	Clock   clock.Clock
}

// FetchFunc returns the content of the blob with the given digest
// ("sha256:<hex>"). The server verifies what it returns.
type FetchFunc func(ctx context.Context, digest string) (io.ReadCloser, error)

func (c *Config) withDefaults() Config {
	out := *c
	out.DHCPAddr = cmp.Or(out.DHCPAddr, ":67")
	out.ProxyAddr = cmp.Or(out.ProxyAddr, ":4011")
	out.TFTPAddr = cmp.Or(out.TFTPAddr, ":69")
	out.HTTPAddr = cmp.Or(out.HTTPAddr, ":80")
	out.LeaseTime = cmp.Or(out.LeaseTime, time.Hour)
	out.OfferHold = cmp.Or(out.OfferHold, time.Minute)
	out.RetryDelay = cmp.Or(out.RetryDelay, 30*time.Second)
	if out.Chainload == nil {
		out.Chainload = map[uint16]string{0: "undionly.kpxe", 7: "ipxe.efi", 9: "ipxe.efi"}
	}
	if out.Leases == nil {
		out.Leases = &MemLeases{}
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Clock == nil {
		out.Clock = clock.Real{}
	}
	return out
}

// ConfigError names the field that is wrong and why.
type ConfigError struct {
	Field, Reason string
}

func (e *ConfigError) Error() string { return "pxe config: " + e.Field + ": " + e.Reason }

func (c *Config) validate() error {
	bad := func(field, reason string) error { return &ConfigError{Field: field, Reason: reason} }
	switch c.Mode {
	case ModeFull, ModeProxy:
	default:
		return bad("Mode", fmt.Sprintf("%q is neither %q nor %q", c.Mode, ModeFull, ModeProxy))
	}
	if !c.ServerIP.Is4() {
		return bad("ServerIP", "an IPv4 address is required")
	}
	if c.Decider == nil {
		return bad("Decider", "required")
	}
	if c.BootDir == "" {
		return bad("BootDir", "required (the directory of the iPXE binaries)")
	}
	if st, err := os.Stat(c.BootDir); err != nil || !st.IsDir() {
		return bad("BootDir", fmt.Sprintf("%q is not a readable directory", c.BootDir))
	}
	for arch, name := range c.Chainload {
		if !validChainName(name) {
			return bad("Chainload", fmt.Sprintf("arch %d: %q must be a plain file name", arch, name))
		}
	}
	if c.Upstream != nil && c.CacheDir == "" {
		return bad("CacheDir", "required with Upstream")
	}
	if c.Mode == ModeFull {
		if !c.Subnet.IsValid() || !c.Subnet.Addr().Is4() {
			return bad("Subnet", "an IPv4 prefix is required in full mode")
		}
		if !c.Subnet.Contains(c.RangeStart) || !c.Subnet.Contains(c.RangeEnd) {
			return bad("RangeStart/RangeEnd", fmt.Sprintf("both must lie in %s", c.Subnet))
		}
		if c.RangeEnd.Less(c.RangeStart) {
			return bad("RangeEnd", "before RangeStart")
		}
		if !c.Subnet.Contains(c.ServerIP) {
			return bad("ServerIP", fmt.Sprintf("%s is outside %s", c.ServerIP, c.Subnet))
		}
		if c.Router.IsValid() && !c.Subnet.Contains(c.Router) {
			return bad("Router", fmt.Sprintf("%s is outside %s", c.Router, c.Subnet))
		}
		for _, d := range c.DNS {
			if !d.Is4() {
				return bad("DNS", fmt.Sprintf("%s is not IPv4", d))
			}
		}
	}
	if c.LeaseTime < time.Minute {
		return bad("LeaseTime", "at least one minute")
	}
	return nil
}

// Server is one site's DHCP, TFTP and HTTP boot services.
type Server struct {
	cfg   Config
	log   *slog.Logger
	pool  *pool // full mode only
	cache *cache

	dhcp      *server4.Server
	dhcpConn  net.PacketConn
	proxy     *server4.Server // proxy mode only
	proxyConn net.PacketConn
	tftp      *tftp.Server
	tftpConn  net.PacketConn
	http      *http.Server
	httpLn    net.Listener
	bootRoot  *os.Root
	filesDir  *os.Root

	// seen remembers each MAC's last DHCP architecture and user class, so the
	// script request (plain HTTP) can tell the Decider what the machine is.
	seenMu sync.Mutex
	seen   map[string]Request

	wg        sync.WaitGroup
	closeOnce sync.Once
	closed    chan struct{} // closed by Close
}

// New checks cfg and returns a Server that is not listening yet.
func New(cfg Config) (*Server, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Server{
		cfg:    c,
		log:    c.Logger.With("component", "pxe", "mode", string(c.Mode)),
		seen:   map[string]Request{},
		closed: make(chan struct{}),
	}, nil
}

// Start opens every listener and serves until Close or until ctx ends. On an
// error nothing is left listening.
func (s *Server) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			s.shutdown()
		}
	}()
	c := &s.cfg
	if s.bootRoot, err = os.OpenRoot(c.BootDir); err != nil {
		return fmt.Errorf("open boot dir: %w", err)
	}
	if c.FilesDir != "" {
		if s.filesDir, err = os.OpenRoot(c.FilesDir); err != nil {
			return fmt.Errorf("open files dir: %w", err)
		}
	}
	if c.CacheDir != "" {
		if s.cache, err = newCache(c.CacheDir, c.Upstream); err != nil {
			return err
		}
	}
	if c.Mode == ModeFull {
		// The range never includes the server's own address or the router.
		s.pool, err = newPool(ctx, c.RangeStart, c.RangeEnd, []netip.Addr{c.ServerIP, c.Router}, c.Leases)
		if err != nil {
			return err
		}
	}

	// HTTP first: its bound port goes into the script URLs DHCP hands out.
	if s.httpLn, err = net.Listen("tcp4", c.HTTPAddr); err != nil {
		return fmt.Errorf("listen http %s: %w", c.HTTPAddr, err)
	}
	s.http = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	s.goServe("http", func() error {
		if err := s.http.Serve(s.httpLn); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})

	if s.tftpConn, err = net.ListenPacket("udp4", c.TFTPAddr); err != nil {
		return fmt.Errorf("listen tftp %s: %w", c.TFTPAddr, err)
	}
	s.tftp = tftp.NewServer(s.tftpRead, nil)
	s.tftp.SetTimeout(5 * time.Second)
	s.goServe("tftp", func() error { return s.tftp.Serve(s.tftpConn) })

	if s.dhcp, s.dhcpConn, err = s.listenDHCP(c.DHCPAddr, s.handleDHCP); err != nil {
		return err
	}
	s.goServe("dhcp", s.dhcp.Serve)
	if c.Mode == ModeProxy {
		if s.proxy, s.proxyConn, err = s.listenDHCP(c.ProxyAddr, s.handlePXE); err != nil {
			return err
		}
		s.goServe("pxe", s.proxy.Serve)
	}

	go func() {
		select {
		case <-ctx.Done():
			_ = s.Close()
		case <-s.closed:
		}
	}()
	s.log.Info("provisioning services listening", "dhcp", s.DHCPAddr().String(), "tftp", s.TFTPAddr().String(), "http", s.HTTPAddr().String(), "interface", c.Interface)
	return nil
}

func (s *Server) listenDHCP(addr string, h server4.Handler) (*server4.Server, net.PacketConn, error) {
	ua, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dhcp address %q: %w", addr, err)
	}
	conn, err := server4.NewIPv4UDPConn(s.cfg.Interface, ua)
	if err != nil {
		return nil, nil, fmt.Errorf("listen dhcp %s: %w", addr, err)
	}
	srv, err := server4.NewServer(s.cfg.Interface, ua, h, server4.WithConn(conn))
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return srv, conn, nil
}

// goServe runs a listener's loop; an error while not closing is logged.
func (s *Server) goServe(name string, serve func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := serve(); err != nil && !s.closing() {
			s.log.Error("listener stopped", "service", name, "err", err)
		}
	}()
}

func (s *Server) closing() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// Close stops every listener and waits for them. Safe to call twice.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.shutdown()
	})
	return nil
}

func (s *Server) shutdown() {
	// Closing the sockets ends server4's Serve loops.
	for _, c := range []net.PacketConn{s.dhcpConn, s.proxyConn} {
		if c != nil {
			_ = c.Close()
		}
	}
	if s.tftp != nil {
		s.tftp.Shutdown()
	} else if s.tftpConn != nil {
		_ = s.tftpConn.Close()
	}
	if s.http != nil {
		_ = s.http.Close()
	} else if s.httpLn != nil {
		_ = s.httpLn.Close()
	}
	s.wg.Wait()
	if s.bootRoot != nil {
		_ = s.bootRoot.Close()
	}
	if s.filesDir != nil {
		_ = s.filesDir.Close()
	}
}

// DHCPAddr is the bound DHCP address (tests ask for port 0).
func (s *Server) DHCPAddr() net.Addr { return connAddr(s.dhcpConn) }

// ProxyAddr is the bound proxyDHCP (PXE 4011) address; nil in full mode.
func (s *Server) ProxyAddr() net.Addr { return connAddr(s.proxyConn) }

func connAddr(c net.PacketConn) net.Addr {
	if c == nil {
		return nil
	}
	return c.LocalAddr()
}

// TFTPAddr is the bound TFTP address.
func (s *Server) TFTPAddr() net.Addr {
	if s.tftpConn == nil {
		return nil
	}
	return s.tftpConn.LocalAddr()
}

// HTTPAddr is the bound HTTP address.
func (s *Server) HTTPAddr() net.Addr {
	if s.httpLn == nil {
		return nil
	}
	return s.httpLn.Addr()
}

// BaseURL is the HTTP root machines use: http://ServerIP:port.
func (s *Server) BaseURL() string {
	port := 80
	if a, ok := s.HTTPAddr().(*net.TCPAddr); ok {
		port = a.Port
	}
	return "http://" + net.JoinHostPort(s.cfg.ServerIP.String(), strconv.Itoa(port))
}

// Lease returns the address bound to mac (full mode).
func (s *Server) Lease(mac net.HardwareAddr) (Lease, bool) {
	if s.pool == nil {
		return Lease{}, false
	}
	return s.pool.Lookup(macKey(mac), s.cfg.Clock.Now())
}
