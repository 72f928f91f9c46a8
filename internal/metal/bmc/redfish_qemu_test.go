package bmc_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest/redfish"
	"github.com/better-compute/better-compute/internal/metal/bmc"
)

// cmdline is a process's arguments joined by spaces, "" when it is gone.
func cmdline(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return string(bytes.ReplaceAll(bytes.TrimRight(b, "\x00"), []byte{0}, []byte{' '}))
}

// TestRedfishDriverPowersQEMU: gofish → the bctest Redfish service → QMP →
// a real QEMU VM. Power on starts the VM (booting from the network when a
// one-time PXE override is set), a cycle starts a new one, off ends it.
func TestRedfishDriverPowersQEMU(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86); CI installs it")
	}
	power, err := redfish.NewQEMUPower(redfish.QEMUConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = power.Close() })
	srv := httptest.NewServer(redfish.New(redfish.Config{Username: "admin", Password: password, Power: power}))
	t.Cleanup(srv.Close)
	var logs bytes.Buffer
	d, err := bmc.New("redfish", srv.URL, bmc.NewCredentials("admin", password), bmc.Options{Logger: newDebugLogger(&logs)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	ctx := context.Background()

	st, err := d.PowerStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, bmc.PowerOff, st)
	require.Zero(t, power.PID())

	require.NoError(t, d.SetBootOverride(ctx, bmc.BootOverride{Target: bmc.BootPXE}))
	require.NoError(t, d.PowerOn(ctx))
	first := power.PID()
	require.NotZero(t, first)
	require.Contains(t, cmdline(first), "qemu-system-x86_64")
	require.Contains(t, cmdline(first), "-boot once=n", "the one-time PXE override reached QEMU")
	st, err = d.PowerStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, bmc.PowerOn, st)

	// A warm reset over QMP keeps the process.
	require.NoError(t, power.Restart(ctx, "", false))
	require.Equal(t, first, power.PID())

	// The ACPI power button is pressed; with no OS to obey it, the VM runs on.
	require.NoError(t, d.Shutdown(ctx))

	// A cycle is a new process, and the spent override is gone from it.
	require.NoError(t, d.PowerCycle(ctx))
	second := power.PID()
	require.NotZero(t, second)
	require.NotEqual(t, first, second)
	require.Empty(t, cmdline(first), "the first VM's process ended")
	require.NotContains(t, cmdline(second), "-boot")
	require.Equal(t, []string{"Pxe", "None"}, power.Boots())

	require.NoError(t, d.PowerOff(ctx))
	require.Zero(t, power.PID())
	require.Empty(t, cmdline(second), "ForceOff ended the VM's process")
	st, err = d.PowerStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, bmc.PowerOff, st)

	require.NotContains(t, logs.String(), password)
}
