package pxe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// handlerTimeout bounds one packet's work (the Decider and the lease store).
const handlerTimeout = 5 * time.Second

// bootAnswer is what a client is told to load, if anything.
type bootAnswer struct {
	file   string // TFTP name or HTTP URL
	ipxe   bool   // the client is iPXE (gets the script URL)
	efi    bool
	client Request
}

// clientOf reads what the packet says about the booting machine.
func clientOf(m *dhcpv4.DHCPv4) Request {
	req := Request{MAC: m.ClientHWAddr, Phase: PhaseDHCP}
	if archs := m.ClientArch(); len(archs) > 0 {
		req.Arch, req.HasArch = uint16(archs[0]), true
	}
	for _, uc := range m.UserClass() {
		if uc == "iPXE" {
			req.UserClass = uc
			break
		}
		if req.UserClass == "" {
			req.UserClass = uc
		}
	}
	return req
}

func isPXEClient(m *dhcpv4.DHCPv4) bool {
	return strings.HasPrefix(m.ClassIdentifier(), "PXEClient")
}

func isEFI(arch uint16) bool { return arch == 6 || arch == 7 || arch == 9 || arch == 10 || arch == 11 }

// decideBoot asks the Decider and picks the file: the script URL for iPXE,
// the chainload binary for a PXE ROM. ok is false when the machine gets no
// boot answer (unknown, no binary for its architecture, or not booting).
func (s *Server) decideBoot(ctx context.Context, m *dhcpv4.DHCPv4) (bootAnswer, bool) {
	req := clientOf(m)
	if len(req.MAC) != 6 {
		return bootAnswer{}, false
	}
	b, err := s.cfg.Decider.Decide(ctx, req)
	if err != nil {
		s.log.Warn("decider failed; no boot answer", "mac", req.MAC.String(), "err", err)
		return bootAnswer{}, false
	}
	if _, unknown := b.(Unknown); unknown || b == nil {
		s.log.Debug("unknown machine; no boot answer", "mac", req.MAC.String())
		return bootAnswer{}, false
	}
	// Remembered for the script request, which carries neither (only
	// machines the Decider knows, so the map stays as small as the site).
	s.seenMu.Lock()
	s.seen[macKey(req.MAC)] = req
	s.seenMu.Unlock()
	ans := bootAnswer{client: req, efi: req.HasArch && isEFI(req.Arch)}
	if req.UserClass == "iPXE" {
		ans.ipxe = true
		ans.file = s.scriptURL(req.MAC)
		return ans, true
	}
	if !req.HasArch {
		// Without option 93: a PXE ROM older than RFC 4578 is a BIOS one;
		// any other client is not network-booting (a deployed OS renewing).
		if !isPXEClient(m) {
			return bootAnswer{}, false
		}
		req.Arch, req.HasArch = 0, true
	}
	name, ok := s.cfg.Chainload[req.Arch]
	if !ok {
		s.log.Warn("no chainload binary for the client's architecture", "mac", req.MAC.String(), "arch", req.Arch)
		return bootAnswer{}, false
	}
	ans.file = name
	return ans, true
}

func (s *Server) scriptURL(mac net.HardwareAddr) string {
	return s.BaseURL() + "/boot/" + mac.String() + ".ipxe"
}

// handleDHCP serves port 67 in both modes.
func (s *Server) handleDHCP(conn net.PacketConn, peer net.Addr, m *dhcpv4.DHCPv4) {
	if m.OpCode != dhcpv4.OpcodeBootRequest {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handlerTimeout)
	defer cancel()
	var reply *dhcpv4.DHCPv4
	var err error
	if s.cfg.Mode == ModeProxy {
		reply, err = s.proxyOffer(ctx, m)
	} else {
		reply, err = s.full(ctx, m)
	}
	if err != nil {
		s.log.Warn("dhcp request not answered", "type", m.MessageType().String(), "mac", m.ClientHWAddr.String(), "err", err)
		return
	}
	if reply != nil {
		s.send(conn, peer, m, reply)
	}
}

// handlePXE serves the PXE port (4011) in proxy mode: a client that took its
// address from the network's server asks here for its boot file.
func (s *Server) handlePXE(conn net.PacketConn, peer net.Addr, m *dhcpv4.DHCPv4) {
	if m.OpCode != dhcpv4.OpcodeBootRequest || !isPXEClient(m) {
		return
	}
	if t := m.MessageType(); t != dhcpv4.MessageTypeRequest && t != dhcpv4.MessageTypeInform {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handlerTimeout)
	defer cancel()
	ans, ok := s.decideBoot(ctx, m)
	if !ok {
		return
	}
	reply, err := dhcpv4.NewReplyFromRequest(m,
		dhcpv4.WithMessageType(dhcpv4.MessageTypeAck),
		dhcpv4.WithServerIP(s.cfg.ServerIP.AsSlice()),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(s.cfg.ServerIP.AsSlice())),
	)
	if err != nil {
		s.log.Warn("build pxe reply", "err", err)
		return
	}
	s.addBootOptions(reply, m, ans, true)
	// The client has an address now: answer it where it asked from.
	if _, err := conn.WriteTo(reply.ToBytes(), peer); err != nil {
		s.log.Warn("send pxe reply", "mac", m.ClientHWAddr.String(), "err", err)
		return
	}
	s.log.Info("pxe boot file sent", "mac", m.ClientHWAddr.String(), "file", ans.file, "port", "4011")
}

// proxyOffer answers a PXE client's DISCOVER with boot options and no
// address; everything else on port 67 belongs to the network's DHCP server.
func (s *Server) proxyOffer(ctx context.Context, m *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error) {
	if m.MessageType() != dhcpv4.MessageTypeDiscover || !isPXEClient(m) {
		return nil, nil
	}
	ans, ok := s.decideBoot(ctx, m)
	if !ok {
		return nil, nil
	}
	reply, err := dhcpv4.NewReplyFromRequest(m,
		dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer),
		dhcpv4.WithYourIP(net.IPv4zero),
		dhcpv4.WithServerIP(s.cfg.ServerIP.AsSlice()),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(s.cfg.ServerIP.AsSlice())),
	)
	if err != nil {
		return nil, err
	}
	s.addBootOptions(reply, m, ans, true)
	s.log.Info("proxydhcp offer", "mac", m.ClientHWAddr.String(), "file", ans.file)
	return reply, nil
}

// addBootOptions puts the boot file in the reply. proxy marks a proxyDHCP
// answer, which a PXE ROM recognises by option 60 "PXEClient".
func (s *Server) addBootOptions(reply, req *dhcpv4.DHCPv4, ans bootAnswer, proxy bool) {
	reply.ServerIPAddr = s.cfg.ServerIP.AsSlice()
	reply.BootFileName = ans.file
	if !ans.ipxe {
		reply.ServerHostName = s.cfg.ServerIP.String()
	}
	if !proxy {
		return
	}
	reply.UpdateOption(dhcpv4.OptClassIdentifier("PXEClient"))
	if guid := req.GetOneOption(dhcpv4.OptionClientMachineIdentifier); guid != nil {
		reply.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionClientMachineIdentifier, guid))
	}
	if !ans.efi {
		// PXE vendor option 6 (discovery control) = 8: skip boot server
		// discovery and boot the file named here. Some UEFI ROMs ignore
		// proxy offers that carry it; they ask on port 4011 instead.
		reply.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{6, 1, 8, 255}))
	}
}

// full serves a DHCP server's side of DISCOVER, REQUEST, DECLINE, RELEASE
// and INFORM on the configured range.
func (s *Server) full(ctx context.Context, m *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error) {
	mac := macKey(m.ClientHWAddr)
	if len(m.ClientHWAddr) != 6 {
		return nil, fmt.Errorf("hardware address of %d bytes", len(m.ClientHWAddr))
	}
	if relay := addrOf(m.GatewayIPAddr); relay.IsValid() && !s.cfg.Subnet.Contains(relay) {
		// Relayed from another subnet: this server has no range there.
		return nil, nil
	}
	now := s.cfg.Clock.Now()
	switch m.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		ip, err := s.pool.Offer(ctx, mac, addrOf(m.RequestedIPAddress()), now, s.cfg.OfferHold)
		if err != nil {
			return nil, err
		}
		s.log.Info("dhcp offer", "mac", mac, "ip", ip.String())
		return s.fullReply(ctx, m, dhcpv4.MessageTypeOffer, ip)

	case dhcpv4.MessageTypeRequest:
		sid := addrOf(m.ServerIdentifier())
		if sid.IsValid() && sid != s.cfg.ServerIP {
			// SELECTING another server's offer: let ours go.
			if ip := addrOf(m.RequestedIPAddress()); ip.IsValid() {
				return nil, s.pool.Release(ctx, mac, ip, now)
			}
			return nil, nil
		}
		ip := addrOf(m.RequestedIPAddress())
		renewing := !ip.IsValid()
		if renewing {
			ip = addrOf(m.ClientIPAddr)
		}
		if !ip.IsValid() || !s.cfg.Subnet.Contains(ip) {
			return s.nak(m, "requested address is not on this network")
		}
		var err error
		if renewing {
			err = s.pool.Renew(ctx, mac, ip, now, s.cfg.LeaseTime)
		} else {
			err = s.pool.Bind(ctx, mac, ip, now, s.cfg.LeaseTime)
		}
		if err != nil {
			s.log.Info("dhcp nak", "mac", mac, "ip", ip.String(), "reason", err)
			return s.nak(m, err.Error())
		}
		s.log.Info("dhcp ack", "mac", mac, "ip", ip.String())
		return s.fullReply(ctx, m, dhcpv4.MessageTypeAck, ip)

	case dhcpv4.MessageTypeDecline:
		ip := addrOf(m.RequestedIPAddress())
		if err := s.pool.Decline(ctx, mac, ip, now, s.cfg.LeaseTime); err != nil {
			return nil, err
		}
		s.log.Warn("dhcp decline: address in use on the network; quarantined", "mac", mac, "ip", ip.String())
		return nil, nil

	case dhcpv4.MessageTypeRelease:
		ip := addrOf(m.ClientIPAddr)
		if err := s.pool.Release(ctx, mac, ip, now); err != nil {
			return nil, err
		}
		s.log.Info("dhcp release", "mac", mac, "ip", ip.String())
		return nil, nil

	case dhcpv4.MessageTypeInform:
		return s.fullReply(ctx, m, dhcpv4.MessageTypeAck, netip.Addr{})
	}
	return nil, nil
}

// fullReply builds an OFFER or ACK for ip with the network's options, and the
// boot file for machines the Decider knows.
func (s *Server) fullReply(ctx context.Context, m *dhcpv4.DHCPv4, t dhcpv4.MessageType, ip netip.Addr) (*dhcpv4.DHCPv4, error) {
	c := &s.cfg
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(t),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(c.ServerIP.AsSlice())),
		dhcpv4.WithNetmask(net.CIDRMask(c.Subnet.Bits(), 32)),
	}
	if ip.IsValid() {
		mods = append(mods, dhcpv4.WithYourIP(ip.AsSlice()), dhcpv4.WithLeaseTime(uint32(c.LeaseTime/time.Second)))
	}
	if c.Router.IsValid() {
		mods = append(mods, dhcpv4.WithRouter(c.Router.AsSlice()))
	}
	if len(c.DNS) > 0 {
		dns := make([]net.IP, 0, len(c.DNS))
		for _, d := range c.DNS {
			dns = append(dns, d.AsSlice())
		}
		mods = append(mods, dhcpv4.WithDNS(dns...))
	}
	reply, err := dhcpv4.NewReplyFromRequest(m, mods...)
	if err != nil {
		return nil, err
	}
	if ans, ok := s.decideBoot(ctx, m); ok {
		s.addBootOptions(reply, m, ans, false)
	}
	return reply, nil
}

func (s *Server) nak(m *dhcpv4.DHCPv4, why string) (*dhcpv4.DHCPv4, error) {
	return dhcpv4.NewReplyFromRequest(m,
		dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(s.cfg.ServerIP.AsSlice())),
		dhcpv4.WithOption(dhcpv4.OptMessage(why)),
	)
}

// send addresses a reply as RFC 2131 §4.1 says: to a relay when relayed;
// else where the client asked from when it has an address (a renewing client
// sends from its ciaddr); else broadcast on the client's port, which server4
// already made of a 0.0.0.0 source.
func (s *Server) send(conn net.PacketConn, peer net.Addr, req, reply *dhcpv4.DHCPv4) {
	dst := peer
	if !ipZero(req.GatewayIPAddr) {
		dst = &net.UDPAddr{IP: req.GatewayIPAddr, Port: dhcpv4.ServerPort}
	}
	if _, err := conn.WriteTo(reply.ToBytes(), dst); err != nil {
		s.log.Warn("send dhcp reply", "to", dst.String(), "err", err)
	}
}

func ipZero(ip net.IP) bool { return ip == nil || ip.IsUnspecified() }

func addrOf(ip net.IP) netip.Addr {
	if ip4 := ip.To4(); ip4 != nil && !ip4.IsUnspecified() {
		a, _ := netip.AddrFromSlice(ip4)
		return a
	}
	return netip.Addr{}
}

// validChainName accepts a plain file name: TFTP serves it from BootDir.
func validChainName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\\\x00") && validScriptText(name)
}

// chainNames lists the files TFTP may serve.
func (s *Server) chainNames() []string {
	var out []string
	for _, n := range s.cfg.Chainload {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

var errNotChainload = errors.New("access violation: only the iPXE chainload binaries are served")
