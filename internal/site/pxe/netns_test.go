package pxe

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/pin/tftp/v3"
	"github.com/stretchr/testify/require"
)

// The real ports (DHCP 67/68, TFTP 69) on a real interface: a veth pair in a
// network namespace, the server on one end and the library's own raw-socket
// client (nclient4) on the other. Root only; the body runs in a child process
// started inside the namespace, so every thread and socket of it is there.

const (
	nsServerIf  = "bcs0"
	nsClientIf  = "bcc0"
	nsClientMAC = "52:54:00:bc:00:02"
	nsNet       = "10.213.78."
	nsInnerEnv  = "BC_PXE_NETNS_INNER"
)

func TestRealPortsInANetworkNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces (DHCP binds port 67 on a real interface); the loopback tests cover the protocol")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip to create network namespaces")
	}
	// Two namespaces joined by a veth pair: the server's and the machine's.
	id := fmt.Sprintf("%d%d", os.Getpid(), time.Now().UnixNano()%1_000_000)
	nsS, nsC := "bcpxes"+id, "bcpxec"+id
	for _, ns := range []string{nsS, nsC} {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", nsS, "link", "add", nsServerIf, "type", "veth", "peer", "name", nsClientIf, "netns", nsC)
	run(t, "ip", "-n", nsS, "addr", "add", nsNet+"1/24", "dev", nsServerIf)
	run(t, "ip", "-n", nsS, "link", "set", nsServerIf, "up")
	run(t, "ip", "-n", nsC, "link", "set", nsClientIf, "address", nsClientMAC)
	run(t, "ip", "-n", nsC, "link", "set", nsClientIf, "up")

	bootDir := t.TempDir()
	chain := bytes.Repeat([]byte{0xeb, 0xfe}, 40_000)
	require.NoError(t, os.WriteFile(filepath.Join(bootDir, "undionly.kpxe"), chain, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(bootDir, "ipxe.efi"), []byte("efi"), 0o644))
	srv := startServerProcess(t, nsS, rigHelperConfig{
		Interface: nsServerIf, Net: nsNet, MAC: nsClientMAC, HTTPAddr: ":8080",
		BootDir: bootDir, Blobs: map[string]string{}, Cache: filepath.Join(t.TempDir(), "cache"),
	})

	cmd := exec.Command("ip", "netns", "exec", nsC, os.Args[0], "-test.run=^TestRealPortsClientInner$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), nsInnerEnv+"="+filepath.Join(bootDir, "undionly.kpxe"))
	cmd.SysProcAttr = dieWithParent()
	out, err := cmd.CombinedOutput()
	if err == nil {
		// The release was the machine's last packet; wait for the server
		// to have handled it.
		require.NoError(t, srv.waitLog("dhcp release", nsClientMAC, nil))
	}
	logs := srv.stop(t)
	t.Logf("machine side:\n%s\nserver side:\n%s", out, logs)
	require.NoError(t, err)
	require.Contains(t, string(out), "--- PASS: TestRealPortsClientInner")
	for _, want := range []string{"dhcp ack", "tftp chainload sent", "tftp request refused", "ipxe script served", "dhcp release"} {
		require.Contains(t, logs, want)
	}
}

// TestRealPortsClientInner is the machine's side of
// TestRealPortsInANetworkNamespace, run in the machine's namespace.
func TestRealPortsClientInner(t *testing.T) {
	chainFile := os.Getenv(nsInnerEnv)
	if chainFile == "" {
		t.Skip("runs inside TestRealPortsInANetworkNamespace's namespace only")
	}
	chain, err := os.ReadFile(chainFile)
	require.NoError(t, err)

	// A PXE ROM's handshake, broadcast on the wire from a raw socket.
	ctx := t.Context()
	client, err := nclient4.New(nsClientIf, nclient4.WithTimeout(10*time.Second), nclient4.WithRetry(5))
	require.NoError(t, err)
	defer client.Close()
	lease, err := client.Request(ctx, pxeROM(iana.INTEL_X86PC)...)
	require.NoError(t, err)
	require.Equal(t, net.ParseIP(nsNet+"100").To4(), lease.ACK.YourIPAddr.To4())
	require.Equal(t, "undionly.kpxe", lease.ACK.BootFileName)
	require.Equal(t, net.ParseIP(nsNet+"1").To4(), lease.ACK.ServerIPAddr.To4())

	// The client takes its address, as the ROM does, and loads the binary
	// from next-server over TFTP; nothing else is served.
	run(t, "ip", "addr", "add", nsNet+"100/24", "dev", nsClientIf)
	tc, err := tftp.NewClient(nsNet + "1:69")
	require.NoError(t, err)
	wt, err := tc.Receive(lease.ACK.BootFileName, "octet")
	require.NoError(t, err)
	var got bytes.Buffer
	_, err = wt.WriteTo(&got)
	require.NoError(t, err)
	require.Equal(t, chain, got.Bytes())
	_, err = tc.Receive("../etc/passwd", "octet")
	require.ErrorContains(t, err, "only the iPXE chainload binaries are served")

	// The chainloaded iPXE asks again and is pointed at its script.
	ipxeLease, err := client.Request(ctx, ipxe(iana.INTEL_X86PC)...)
	require.NoError(t, err)
	require.Equal(t, net.ParseIP(nsNet+"100").To4(), ipxeLease.ACK.YourIPAddr.To4())
	url := ipxeLease.ACK.BootFileName
	require.Equal(t, "http://"+nsNet+"1:8080/boot/"+nsClientMAC+".ipxe", url)
	resp, err := http.Get(url)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "sanboot --no-describe --drive 0x80")

	// The machine gives its address back, unicast from that address as
	// RFC 2131 §4.4.4 says (the parent checks the server's log for it).
	rel, err := dhcpv4.NewReleaseFromACK(ipxeLease.ACK)
	require.NoError(t, err)
	conn, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(nsNet + "100"), Port: 68}, &net.UDPAddr{IP: net.ParseIP(nsNet + "1"), Port: 67})
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write(rel.ToBytes())
	require.NoError(t, err)
}
