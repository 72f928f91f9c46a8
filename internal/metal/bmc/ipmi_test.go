package bmc_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/metal/bmc"
)

// ipmiRig is OpenIPMI's ipmi_sim as the BMC of a QEMU VM: ipmi_sim starts
// the VM on power on (its startcmd) and kills it on power off, and QEMU's
// ipmi-bmc-extern device talks back to it over a socket, as a real board's
// KCS interface talks to its BMC.
type ipmiRig struct {
	address string      // ipmi_sim's LAN interface, host:port
	pidfile string      // QEMU writes its pid here while it runs
	name    string      // QEMU's -name: tells our VM from any other
	log     *syncBuffer // ipmi_sim's output
}

// syncBuffer is a bytes.Buffer a process writes while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func freePort(t *testing.T, network string) int {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		require.NoError(t, err)
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func startIPMIRig(t *testing.T) ipmiRig {
	t.Helper()
	sim, err := exec.LookPath("ipmi_sim")
	if err != nil {
		t.Skip("ipmi_sim is not installed (apt-get install openipmi ipmitool); CI installs it")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86); CI installs it")
	}
	dir := t.TempDir()
	lanPort, serialPort := freePort(t, "udp"), freePort(t, "tcp")
	rig := ipmiRig{
		address: fmt.Sprintf("127.0.0.1:%d", lanPort),
		pidfile: filepath.Join(dir, "qemu.pid"),
		name:    fmt.Sprintf("bctest-ipmi-%d", lanPort),
		log:     &syncBuffer{},
	}
	// TCG, 32 MiB, no disk, no display: SeaBIOS finds nothing to boot and
	// waits, which is all a power test needs.
	startcmd := strings.Join([]string{qemu, "-accel tcg -m 32 -nographic -nodefaults",
		"-name", rig.name, "-pidfile", rig.pidfile,
		fmt.Sprintf("-chardev socket,id=ipmi0,host=127.0.0.1,port=%d,reconnect=1", serialPort),
		"-device ipmi-bmc-extern,id=bmc0,chardev=ipmi0 -device isa-ipmi-kcs,bmc=bmc0"}, " ")
	lanConf := fmt.Sprintf(`name "bctest"
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
  serial 15 127.0.0.1 %d codec VM
  startcmd "%s"
  startnow false
  poweroff_wait 2
  kill_wait 2
  user 2 true "admin" "%s" admin 10 md5
`, lanPort, serialPort, startcmd, password)
	emu := `mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr
sel_enable 0x20 1000 0x0a
mc_enable 0x20
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "lan.conf"), []byte(lanConf), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bmc.emu"), []byte(emu), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "state"), 0o700))

	cmd := exec.Command(sim, "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(dir, "bmc.emu"), "-s", filepath.Join(dir, "state"), "-n")
	cmd.Stdout, cmd.Stderr = rig.log, rig.log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		// ipmi_sim leaves a running VM behind when it dies: end both.
		if pid := rig.qemuPID(); pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return rig
}

// qemuPID is the pid of our running VM, 0 if none runs.
func (r ipmiRig) qemuPID() int {
	b, err := os.ReadFile(r.pidfile)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || !running(pid, r.name) {
		return 0
	}
	return pid
}

// running: the process exists, is not a zombie and is our QEMU.
func running(pid int, name string) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(name)) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the ")" that closes the command name.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func TestIPMIDriverPowersQEMU(t *testing.T) {
	t.Parallel()
	forEachIPMIBackend(t, testIPMIDriverPowersQEMU)
}

func testIPMIDriverPowersQEMU(t *testing.T, be ipmiBackend) {
	rig := startIPMIRig(t)
	// A driver process writes its log lines while the test runs.
	logs := &syncBuffer{}
	d, err := be.new(t, rig.address, bmc.NewCredentials("admin", password), bmc.Options{Logger: newDebugLogger(logs)})
	require.NoError(t, err)
	ctx := context.Background()

	// ipmi_sim binds its port shortly after it starts.
	var status bmc.PowerState
	bctest.WaitFor(t, "ipmi_sim to answer", func() bool {
		status, err = d.PowerStatus(ctx)
		return err == nil
	})
	require.Equal(t, bmc.PowerOff, status, rig.log.String())
	require.Zero(t, rig.qemuPID())

	require.NoError(t, d.PowerOn(ctx))
	bctest.WaitFor(t, "the QEMU process to run", func() bool { return rig.qemuPID() != 0 })
	first := rig.qemuPID()
	status, err = d.PowerStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, bmc.PowerOn, status)
	require.NoError(t, d.PowerOn(ctx), "on when on")
	require.Equal(t, first, rig.qemuPID(), "powering on a running machine leaves it alone")
	// ipmi_sim takes an ACPI shutdown request only once the VM's KCS device
	// has connected back to it (until then: "invalid data field"). The VM
	// has no OS to obey the request.
	bctest.WaitFor(t, "the VM to connect to ipmi_sim and the shutdown request to be accepted", func() bool {
		err := d.Shutdown(ctx)
		if err != nil {
			require.ErrorIs(t, err, bmc.ErrUnsupported)
		}
		return err == nil
	})

	// A cycle is a new QEMU process: the old one ended, a new one runs.
	require.NoError(t, d.PowerCycle(ctx))
	bctest.WaitFor(t, "a new QEMU process after the cycle", func() bool {
		pid := rig.qemuPID()
		return pid != 0 && pid != first && !running(first, rig.name)
	})
	second := rig.qemuPID()
	status, err = d.PowerStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, bmc.PowerOn, status)

	// The emulator refuses a boot device: a typed "unsupported".
	err = d.SetBootOverride(ctx, bmc.BootOverride{Target: bmc.BootPXE})
	require.ErrorIs(t, err, bmc.ErrUnsupported)
	require.Contains(t, err.Error(), "set boot override")

	require.NoError(t, d.PowerOff(ctx))
	bctest.WaitFor(t, "the QEMU process to end", func() bool { return !running(second, rig.name) })
	// ipmi_sim learns of the exit from SIGCHLD, a moment later.
	bctest.WaitFor(t, "the BMC to report power off", func() bool {
		status, err = d.PowerStatus(ctx)
		require.NoError(t, err)
		return status == bmc.PowerOff
	})
	require.NoError(t, d.PowerOff(ctx), "off when off")

	// Off, a cycle turns the machine on.
	require.NoError(t, d.PowerCycle(ctx))
	bctest.WaitFor(t, "the QEMU process to run after a cycle from off", func() bool { return rig.qemuPID() != 0 })
	require.NoError(t, d.PowerOff(ctx))
	bctest.WaitFor(t, "the QEMU process to end", func() bool { return rig.qemuPID() == 0 })

	require.NotContains(t, logs.String(), password)
}

func TestIPMIDriverTypedErrors(t *testing.T) {
	t.Parallel()
	forEachIPMIBackend(t, testIPMIDriverTypedErrors)
}

func testIPMIDriverTypedErrors(t *testing.T, be ipmiBackend) {
	rig := startIPMIRig(t)
	ctx := context.Background()
	good, err := be.new(t, rig.address, bmc.NewCredentials("admin", password), bmc.Options{})
	require.NoError(t, err)
	bctest.WaitFor(t, "ipmi_sim to answer", func() bool {
		_, err := good.PowerStatus(ctx)
		return err == nil
	})

	for _, creds := range []bmc.Credentials{
		bmc.NewCredentials("admin", "wrong-"+password[:10]),
		bmc.NewCredentials("nobody", password),
	} {
		d, err := be.new(t, rig.address, creds, bmc.Options{})
		require.NoError(t, err)
		err = d.PowerOn(ctx)
		require.ErrorIs(t, err, bmc.ErrAuth, "%v", creds)
		require.Contains(t, err.Error(), "bmc ipmi "+rig.address+": power on: authentication failed")
		require.NotContains(t, err.Error(), password)
	}
	require.Zero(t, rig.qemuPID(), "a refused power on started nothing")

	d, err := be.new(t, fmt.Sprintf("127.0.0.1:%d", freePort(t, "udp")), bmc.NewCredentials("admin", password), bmc.Options{})
	require.NoError(t, err)
	_, err = d.PowerStatus(ctx)
	require.ErrorIs(t, err, bmc.ErrUnreachable)
	require.NotContains(t, err.Error(), password)
}

func newDebugLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestIPMIDriverSetPassword rotates the password of the driver's user on
// ipmi_sim: afterwards the new password opens a session and the old one is
// refused as bad credentials. A password longer than every BMC takes in
// full is refused before anything is sent.
func TestIPMIDriverSetPassword(t *testing.T) {
	t.Parallel()
	forEachIPMIBackend(t, testIPMIDriverSetPassword)
}

func testIPMIDriverSetPassword(t *testing.T, be ipmiBackend) {
	const first, next = "Old-pass-16bytes", "N3w-pass-0f16byt"
	sim := bctest.StartIPMISim(t, "admin", first)
	ctx := context.Background()
	old, err := be.new(t, sim.Address, bmc.NewCredentials("admin", first), bmc.Options{})
	require.NoError(t, err)

	setter, ok := old.(bmc.PasswordSetter)
	require.True(t, ok, "the IPMI driver sets passwords")
	tooLong := strings.Repeat("x", bmc.MaxIPMIPassword+1)
	err = setter.SetPassword(ctx, tooLong)
	require.ErrorIs(t, err, bmc.ErrInvalidArgument)
	require.NotContains(t, err.Error(), tooLong)
	require.NoError(t, sim.Login("admin", first), "a refused password changed nothing")

	require.NoError(t, setter.SetPassword(ctx, next))
	_, err = old.PowerStatus(ctx)
	require.ErrorIs(t, err, bmc.ErrAuth, "the old password no longer opens a session")
	fresh, err := be.new(t, sim.Address, bmc.NewCredentials("admin", next), bmc.Options{})
	require.NoError(t, err)
	_, err = fresh.PowerStatus(ctx)
	require.NoError(t, err, "the new password opens a session")
}
