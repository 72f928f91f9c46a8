package bctest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/types"
)

// IPMISim is OpenIPMI's ipmi_sim serving IPMI 2.0 over LAN (RMCP+) on
// loopback with one administrator account: a real BMC's protocol and user
// store (Set User Password included), without a machine behind it.
type IPMISim struct {
	// Address is the BMC's LAN interface, host:port (the ipmi driver's
	// address).
	Address string
	cmd     *exec.Cmd
}

// RequireIPMISim skips the test when ipmi_sim is not installed, except in
// CI (CI=true), where .ci/run installs openipmi and its absence fails.
func RequireIPMISim(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("ipmi_sim"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("ipmi_sim is not installed; .ci/run installs openipmi")
		}
		t.Skip("ipmi_sim is not installed (apt-get install openipmi)")
	}
}

// StartIPMISim starts ipmi_sim with user id 2 named username, an
// administrator with password, and waits until it opens a session with
// them. It stops at the end of the test.
func StartIPMISim(t testing.TB, username, password string) *IPMISim {
	t.Helper()
	RequireIPMISim(t)
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := c.LocalAddr().(*net.UDPAddr).Port
	_ = c.Close()
	dir := t.TempDir()
	lan := fmt.Sprintf(`name "bctest"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 %d
    priv_limit admin
    allowed_auths_callback md5
    allowed_auths_user md5
    allowed_auths_operator md5
    allowed_auths_admin md5
    guid a123456789abcdefa123456789abcdef
  endlan
  user 2 true %q %q admin 10 md5
`, port, username, password)
	emu := "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nmc_enable 0x20\n"
	for name, body := range map[string]string{"lan.conf": lan, "bmc.emu": emu} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "state"), 0o700); err != nil {
		t.Fatal(err)
	}
	s := &IPMISim{Address: fmt.Sprintf("127.0.0.1:%d", port)}
	s.cmd = exec.Command("ipmi_sim", "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(dir, "bmc.emu"),
		"-s", filepath.Join(dir, "state"), "-n")
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	WaitFor(t, "ipmi_sim to open a session", func() bool { return s.Login(username, password) == nil })
	return s
}

// Login opens and closes an RMCP+ session (cipher suite 3) with the
// given credentials: nil when the BMC takes them.
func (s *IPMISim) Login(username, password string) error {
	host, port, err := net.SplitHostPort(s.Address)
	if err != nil {
		return err
	}
	var p int
	if _, err := fmt.Sscan(port, &p); err != nil {
		return err
	}
	c, err := client.NewClient(host, p, username, password)
	if err != nil {
		return err
	}
	c.WithInterface(client.InterfaceLanplus).WithCipherSuiteID(types.CipherSuiteID3).WithTimeout(2 * time.Second).WithRetry(0)
	ctx := context.Background()
	err = c.Connect(ctx)
	_ = c.Close(ctx)
	return err
}

// Stop ends ipmi_sim: the BMC stops answering.
func (s *IPMISim) Stop() {
	if s.cmd.Process != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}
