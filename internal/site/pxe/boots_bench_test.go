package pxe

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/pin/tftp/v3"
)

// BenchmarkConcurrentBoots: one site's PXE services (the real Server: full
// DHCP, TFTP, HTTP) boot 50 machines at once, each the whole network part
// of a ramdisk boot as a PXE ROM and iPXE do it: DHCP DISCOVER/REQUEST as
// the ROM, the chainload binary over TFTP, DHCP again as iPXE, the
// machine's iPXE script, then the kernel and initrd over HTTP. The clients
// are Go's (insomniacslk/dhcp packets, pin/tftp, net/http) on loopback:
// the subnet is 127.77.0.0/24, so each machine's HTTP requests come from
// the address it leased, as the script's lease check wants. The kernel and
// initrd are `make ramdisk`'s (BC_RAMDISK_DIR or .cache/ramdisk/out) when
// built, else random files of the same sizes.
//
//	go test -run '^$' -bench ConcurrentBoots -benchtime 5x ./internal/site/pxe/
func BenchmarkConcurrentBoots(b *testing.B) {
	const machines = 50
	bootDir, files := b.TempDir(), b.TempDir()
	chain := make([]byte, 70_000)
	_, _ = rand.Read(chain)
	must(b, os.WriteFile(filepath.Join(bootDir, "undionly.kpxe"), chain, 0o644))
	kernel, initrd := ramdiskFiles(b, files)
	dec := DeciderFunc(func(context.Context, Request) (Boot, error) {
		return Ramdisk{Kernel: "vmlinuz", Initrd: "initrd.cpio.gz", Cmdline: "console=ttyS0", Token: "tok"}, nil
	})
	srv, err := New(Config{Mode: ModeFull, ServerIP: netip.MustParseAddr("127.77.0.1"), DHCPAddr: "127.77.0.1:0",
		TFTPAddr: "127.77.0.1:0", HTTPAddr: "127.77.0.1:0", Subnet: netip.MustParsePrefix("127.77.0.0/24"),
		RangeStart: netip.MustParseAddr("127.77.0.10"), RangeEnd: netip.MustParseAddr("127.77.0.250"), LeaseTime: time.Hour,
		BootDir: bootDir, FilesDir: files, Decider: dec, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	must(b, err)
	must(b, srv.Start(b.Context()))
	b.Cleanup(func() { _ = srv.Close() })
	dhcpAddr, tftpAddr := srv.DHCPAddr().String(), srv.TFTPAddr().String()

	b.ReportAllocs()
	b.ResetTimer()
	var total time.Duration
	for b.Loop() {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, machines)
		for i := range machines {
			wg.Go(func() {
				mac := net.HardwareAddr{0x52, 0x54, 0x00, 0xbe, byte(i >> 8), byte(i)}
				if err := boot(dhcpAddr, tftpAddr, mac, kernel+initrd); err != nil {
					errs <- fmt.Errorf("machine %s: %w", mac, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		total += time.Since(start)
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/50-boots")
	b.ReportMetric(float64(machines*(kernel+initrd))/total.Seconds()*float64(b.N)/(1<<20), "MiB/s")
}

// boot is one machine's PXE boot, network side; want is the kernel and
// initrd bytes it must receive.
func boot(dhcpAddr, tftpAddr string, mac net.HardwareAddr, want int64) error {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return err
	}
	defer conn.Close()
	server, err := net.ResolveUDPAddr("udp4", dhcpAddr)
	if err != nil {
		return err
	}
	ex := func(m *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error) {
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := conn.WriteTo(m.ToBytes(), server); err != nil {
			return nil, err
		}
		buf := make([]byte, 1500)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return nil, err
			}
			r, err := dhcpv4.FromBytes(buf[:n])
			if err == nil && r.TransactionID == m.TransactionID {
				return r, nil
			}
		}
	}
	lease := func(mods ...dhcpv4.Modifier) (*dhcpv4.DHCPv4, error) {
		d, err := dhcpv4.NewDiscovery(mac, mods...)
		if err != nil {
			return nil, err
		}
		offer, err := ex(d)
		if err != nil {
			return nil, fmt.Errorf("discover: %w", err)
		}
		req, err := dhcpv4.NewRequestFromOffer(offer, mods...)
		if err != nil {
			return nil, err
		}
		ack, err := ex(req)
		if err != nil {
			return nil, fmt.Errorf("request: %w", err)
		}
		if ack.MessageType() != dhcpv4.MessageTypeAck {
			return nil, fmt.Errorf("got %s", ack.MessageType())
		}
		return ack, nil
	}
	rom := []dhcpv4.Modifier{dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(iana.INTEL_X86PC))}
	ack, err := lease(rom...)
	if err != nil {
		return fmt.Errorf("rom dhcp: %w", err)
	}
	tc, err := tftp.NewClient(tftpAddr)
	if err != nil {
		return err
	}
	tc.SetTimeout(10 * time.Second)
	wt, err := tc.Receive(ack.BootFileName, "octet")
	if err != nil {
		return fmt.Errorf("tftp %s: %w", ack.BootFileName, err)
	}
	if _, err := wt.WriteTo(io.Discard); err != nil {
		return fmt.Errorf("tftp: %w", err)
	}
	ack, err = lease(append(rom, dhcpv4.WithUserClass("iPXE", false))...)
	if err != nil {
		return fmt.Errorf("ipxe dhcp: %w", err)
	}
	// HTTP from the leased address, as the machine's iPXE would.
	hc := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: ack.YourIPAddr}}).DialContext}, Timeout: 2 * time.Minute}
	script, err := get(hc, ack.BootFileName)
	if err != nil {
		return fmt.Errorf("script: %w", err)
	}
	var got int64
	for _, line := range strings.Split(string(script), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "kernel" || f[0] == "initrd") {
			url := f[1]
			if f[0] == "initrd" {
				url = f[3] // initrd --name initrd URL
			}
			b, err := get(hc, url)
			if err != nil {
				return fmt.Errorf("%s: %w", f[0], err)
			}
			got += int64(len(b))
		}
	}
	if got != want {
		return fmt.Errorf("received %d bytes of kernel and initrd, want %d", got, want)
	}
	return nil
}

func get(c *http.Client, url string) ([]byte, error) {
	res, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, res.Status)
	}
	return io.ReadAll(res.Body)
}

// ramdiskFiles puts a kernel and an initrd in dir: the built ramdisk's
// when there is one, else random bytes of its sizes.
func ramdiskFiles(b *testing.B, dir string) (kernel, initrd int64) {
	src := os.Getenv("BC_RAMDISK_DIR")
	if src == "" {
		src = filepath.Join("..", "..", "..", ".cache", "ramdisk", "out")
	}
	sizes := map[string]int64{"vmlinuz": 8 << 20, "initrd.cpio.gz": 9 << 20}
	for name, size := range sizes {
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			data = make([]byte, size)
			_, _ = rand.Read(data)
		}
		must(b, os.WriteFile(filepath.Join(dir, name), data, 0o644))
		sizes[name] = int64(len(data))
	}
	return sizes["vmlinuz"], sizes["initrd.cpio.gz"]
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}
