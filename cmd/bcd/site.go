package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/better-compute/better-compute/internal/agent/site"
	"github.com/better-compute/better-compute/internal/site/pxe"
)

// siteServices builds --mode site's command handler and the PXE
// configuration its flags describe; a bad flag is named.
func (o *options) siteServices(ctx context.Context, log *slog.Logger) (*site.Agent, pxe.Config, error) {
	s := o.site
	cfg := pxe.Config{Interface: s.iface, BootDir: s.bootDir, FilesDir: s.filesDir, HTTPAddr: s.httpListen, Logger: log,
		CacheDir: s.cacheDir}
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(o.stateDir, "cache")
	}
	var err error
	if cfg.ServerIP, err = netip.ParseAddr(s.serverIP); err != nil {
		return nil, pxe.Config{}, fmt.Errorf("--site-server-ip %q: want this host's IPv4 address on the provisioning network", s.serverIP)
	}
	switch s.dhcpMode {
	case "proxy":
		cfg.Mode = pxe.ModeProxy
	case "full":
		cfg.Mode = pxe.ModeFull
		if cfg.Subnet, err = netip.ParsePrefix(s.subnet); err != nil {
			return nil, pxe.Config{}, fmt.Errorf("--site-subnet %q: want a CIDR such as 10.0.0.0/24", s.subnet)
		}
		first, last, ok := strings.Cut(s.rangeSpec, "-")
		if cfg.RangeStart, err = netip.ParseAddr(strings.TrimSpace(first)); !ok || err != nil {
			return nil, pxe.Config{}, fmt.Errorf("--site-range %q: want FIRST-LAST addresses", s.rangeSpec)
		}
		if cfg.RangeEnd, err = netip.ParseAddr(strings.TrimSpace(last)); err != nil {
			return nil, pxe.Config{}, fmt.Errorf("--site-range %q: want FIRST-LAST addresses", s.rangeSpec)
		}
		if s.router != "" {
			if cfg.Router, err = netip.ParseAddr(s.router); err != nil {
				return nil, pxe.Config{}, fmt.Errorf("--site-router %q: want an address", s.router)
			}
		}
	default:
		return nil, pxe.Config{}, fmt.Errorf("--site-dhcp %q: want proxy or full", s.dhcpMode)
	}
	_, port, err := net.SplitHostPort(s.httpListen)
	if err != nil {
		return nil, pxe.Config{}, fmt.Errorf("--site-http-listen %q: want [HOST]:PORT", s.httpListen)
	}
	if s.controlPlaneURL != "" {
		log.Warn("--site-control-plane-url is ignored: images come over the gateway connection, bound to this agent's certificate")
	}
	drivers, err := site.LoadDrivers(ctx, s.driversDir, log)
	if err != nil {
		return nil, pxe.Config{}, fmt.Errorf("--site-drivers-dir %q: %w", s.driversDir, err)
	}
	for _, d := range drivers.List() {
		log.Info("BMC driver", "name", d.Name, "reports", d.Reports, "version", d.Version, "built_in", d.BuiltIn, "path", d.Path)
	}
	a, err := site.New(site.Config{StateDir: o.stateDir, Logger: log, Drivers: drivers,
		Ramdisk:   pxe.Ramdisk{Kernel: s.kernel, Initrd: s.initrd, Cmdline: s.cmdline},
		ImagesURL: "http://" + net.JoinHostPort(cfg.ServerIP.String(), port) + "/files/sha256"})
	if err != nil {
		return nil, pxe.Config{}, err
	}
	cfg.Decider = a
	// Images come through from the control plane, only for a machine of
	// the site that deploys them.
	cfg.Upstream = a.FetchImage
	return a, cfg, nil
}
