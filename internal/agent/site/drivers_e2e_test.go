package site_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/agent/site"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/site/pxe"
	"github.com/better-compute/better-compute/pkg/driver"
)

// buildExampleDriver builds examples/bmc-driver to path with the go tool
// that runs the tests, as a site's operator would install it.
func buildExampleDriver(t *testing.T, path string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go tool runs this test")
	root, err := filepath.Abs("../../..")
	require.NoError(t, err)
	build := exec.CommandContext(t.Context(), goBin, "build", "-o", path, "./examples/bmc-driver")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./examples/bmc-driver:\n%s", out)
}

func (f *fixture) drivers(t *testing.T, site string) []*apiv1.SiteDriver {
	t.Helper()
	res, err := f.admin.Sites.ListDrivers(context.Background(), connect.NewRequest(&apiv1.ListSiteDriversRequest{Tenant: "acme", Site: site}))
	require.NoError(t, err)
	return res.Msg.GetDrivers()
}

// TestSiteAgentExternalDriver: bcd in site mode with a drivers directory
// holding examples/bmc-driver reports it beside the built-ins; drivers
// list shows all three with versions; a machine enrolls naming it, and
// the agent drives its BMC through the driver process. Another site, whose
// agent did not report it, refuses the name; and once the agent comes back
// without the driver, the machine's power step is refused with the reason
// instead of reaching the agent.
func TestSiteAgentExternalDriver(t *testing.T) {
	t.Parallel()
	t.Cleanup(driver.CleanupClients)
	f := setup(t)
	ctx := context.Background()
	driversDir := t.TempDir()
	buildExampleDriver(t, filepath.Join(driversDir, "acme-ipmi"))
	reg, err := site.LoadDrivers(ctx, driversDir, quiet())
	require.NoError(t, err)

	dir := t.TempDir()
	sa := startSiteAgentDrivers(t, f.cp, dir, f.siteToken(t, "dc1"), reg)
	bctest.WaitFor(t, "the site agent to hold the boot lease", func() bool { return f.lease(t).HolderNodeID == sa.ag.NodeID() })
	bctest.WaitFor(t, "the site agent's drivers to be recorded", func() bool { return len(f.drivers(t, "dc1")) == 3 })

	ds := f.drivers(t, "dc1")
	for i, want := range []string{"ipmi", "redfish"} {
		require.Equal(t, want, ds[i].GetName())
		require.Equal(t, "builtin", ds[i].GetKind())
		require.NotEmpty(t, ds[i].GetVersion())
		require.Empty(t, ds[i].GetPath())
		require.Equal(t, sa.ag.NodeID(), ds[i].GetNodeId())
	}
	ext := ds[2]
	require.Equal(t, "acme-ipmi", ext.GetName())
	require.Equal(t, "external", ext.GetKind())
	require.Equal(t, "ipmi", ext.GetReports(), "the example serves the built-in IPMI driver")
	require.Equal(t, ds[0].GetVersion(), ext.GetVersion(), "built from this module: the same version")
	require.Equal(t, filepath.Join(driversDir, "acme-ipmi"), ext.GetPath())
	require.Contains(t, ext.GetCapabilities(), "set_password")
	require.Equal(t, f.site.GetId(), ext.GetSiteId())
	require.Empty(t, f.drivers(t, "dc2"), "no agent of dc2 reported")

	// Enroll names the external driver at dc1; at dc2, whose agents never
	// reported it, the name is refused with the drivers dc2 has.
	enroll := func(site, name, mac string) (*apiv1.Machine, error) {
		res, err := f.admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: site, Name: name,
			BmcDriver: "acme-ipmi", BmcAddress: "127.0.0.1:1", BmcUsername: "admin", BmcPassword: "pw-" + name, Mac: mac,
			HardwareProfile: "test"}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetMachine(), nil
	}
	m, err := enroll("dc1", "m-ext", "52:54:00:00:03:01")
	require.NoError(t, err)
	require.Equal(t, "acme-ipmi", m.GetBmcDriver())
	require.Equal(t, "127.0.0.1:1", m.GetBmcAddress(), "an external driver's address is kept as given")
	_, err = enroll("dc2", "x-ext", "52:54:00:00:03:02")
	require.Error(t, err)
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
	v := client.Detail(err).GetViolations()
	require.Len(t, v, 1)
	require.Equal(t, "bmc_driver", v[0].GetField())
	require.Contains(t, v[0].GetReason(), `site dc2 has no driver "acme-ipmi": its agents report ipmi, redfish`)

	// The agent builds the machine's driver from its registry: the driver
	// process answers, and nothing answers at the BMC's address.
	bctest.WaitFor(t, "the machine list to reach the site agent", func() bool { return len(sa.site.Machines()) == 1 })
	_, err = f.cp.App.Metal.PowerStatus(ctx, m.GetId())
	require.Error(t, err)
	require.Contains(t, err.Error(), "BMC_FAILED")
	require.NotContains(t, err.Error(), site.FailNoDriver)
	require.NotContains(t, err.Error(), "pw-m-ext", "never a BMC password")

	// The same bcd restarted without its drivers directory reports the
	// built-ins only; the machine's power cycle is refused before it is
	// sent, with the reason.
	sa.stop()
	sa = startSiteAgent(t, f.cp, dir, "")
	bctest.WaitFor(t, "the restarted agent's drivers to be recorded", func() bool { return len(f.drivers(t, "dc1")) == 2 })
	bctest.WaitFor(t, "the site agent to hold the boot lease again", func() bool { return f.lease(t).HolderNodeID == sa.ag.NodeID() })
	sent := len(f.commands(t, "bmc.power"))
	_, err = f.admin.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: "m-ext"}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the power cycle to be refused", func() bool { return step(f.workflow(t, "m-ext"), "boot-ramdisk").Failures > 0 })
	got := step(f.workflow(t, "m-ext"), "boot-ramdisk")
	require.NotEqual(t, provision.StepSucceeded, got.State)
	require.Contains(t, got.Error, `machine m-ext names BMC driver "acme-ipmi", but site `+f.site.GetId())
	require.Contains(t, got.Error, "reports only ipmi, redfish")
	require.Len(t, f.commands(t, "bmc.power"), sent, "nothing was sent to the agent")
}

// TestSiteAgentRefusesUnknownDriver: a command naming a driver the agent
// does not have — one removed from its drivers directory, or a
// plugin:<path> that would start any binary on the site's host — fails
// NO_DRIVER, naming the agent's drivers, before any BMC call or
// idempotency record; the same key is applied once the driver is there.
func TestSiteAgentRefusesUnknownDriver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	a, err := site.New(site.Config{StateDir: dir, Logger: quiet(), Ramdisk: pxe.Ramdisk{Kernel: "k", Initrd: "i"}})
	require.NoError(t, err)
	require.Equal(t, []string{"ipmi", "redfish"}, names(a.BMCDrivers()), "built-ins only without a drivers directory")
	for _, drv := range []string{"acme-ipmi", "plugin:/bin/sh"} {
		list := map[string]any{"epoch": 1, "machines": []any{map[string]any{"id": "mch_1", "name": "m1", "mac": "52:54:00:00:00:01",
			"bmc_driver": drv, "bmc_address": "127.0.0.1:1", "boot": "disk"}}}
		_, err = a.Apply(ctx, command(t, "c-list-"+drv, site.KindSiteMachines, "", list))
		require.NoError(t, err)
		p := map[string]any{"epoch": 1, "machine_id": "mch_1", "mac": "52:54:00:00:00:01", "action": "cycle",
			"bmc": map[string]any{"driver": drv, "address": "127.0.0.1:1", "username": "admin", "password": "s3cret-pw"}}
		_, err = a.Apply(ctx, command(t, "c-"+drv, site.KindBMCPower, "wf:"+drv, p))
		require.Equal(t, site.FailNoDriver, failureCode(err), "%v", err)
		require.Contains(t, err.Error(), "it has ipmi, redfish")
		require.NotContains(t, err.Error(), "s3cret-pw")
	}
	state, err := os.ReadFile(filepath.Join(dir, "site.json"))
	require.NoError(t, err)
	require.NotContains(t, string(state), "wf:acme-ipmi", "no idempotency record: the key can be applied later")
}

func names(ds []*agentv1.BMCDriver) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.GetName())
	}
	return out
}
