package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/store"
)

// TestMetalCommands drives the sites and machines verbs against a real
// control plane with a simulated site: a site, a machine enrolled with its
// password from a file (never echoed), commissioned to ready with its
// erase record shown, a refused release, retire and the site's delete.
func TestMetalCommands(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	dir := t.TempDir()
	env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: cp.AdminKey, "HOME": dir}
	cli := func(argv ...string) (int, string, string) {
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	ok := func(argv ...string) string {
		t.Helper()
		code, out, errs := cli(argv...)
		require.Equal(t, 0, code, "%v: %s", argv, errs)
		return out
	}
	ok("tenants", "create", "acme")

	var site struct{ Site struct{ Id string } }
	require.NoError(t, json.Unmarshal([]byte(ok("sites", "create", "dc1", "--tenant", "acme", "--networks", "127.0.0.0/8", "-o", "json")), &site))
	require.Contains(t, ok("sites", "list", "--tenant", "acme"), "127.0.0.0/8")
	require.Contains(t, ok("sites", "update", "dc1", "--tenant", "acme", "--dhcp-mode", "proxy"), "proxy")
	sim := bctest.NewSimSite(t, cp.App.Metal, site.Site.Id)
	sm := sim.AddMachine(t, "m1")

	pwFile := filepath.Join(dir, "bmc-password")
	require.NoError(t, os.WriteFile(pwFile, []byte(sm.Password+"\n"), 0o600))
	code, _, errs := cli("machines", "enroll", "m1", "--tenant", "acme", "--site", "dc1", "--bmc-driver", "redfish",
		"--bmc-address", sm.BMCAddress, "--bmc-username", sm.Username, "--mac", sm.MAC)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "bmc-password-file")
	out := ok("machines", "enroll", "m1", "--tenant", "acme", "--site", "dc1", "--bmc-driver", "redfish",
		"--bmc-address", sm.BMCAddress, "--bmc-username", sm.Username, "--bmc-password-file", pwFile, "--mac", sm.MAC, "-o", "json")
	require.NotContains(t, out, sm.Password)
	require.Contains(t, out, `"enrolled"`)

	require.Contains(t, ok("machines", "commission", "m1", "--tenant", "acme"), "commissioning")
	bctest.WaitFor(t, "m1 to be ready", func() bool {
		return strings.Contains(ok("machines", "list", "--tenant", "acme", "--state", "ready"), "m1")
	})
	got := ok("machines", "get", "m1", "--tenant", "acme")
	require.Contains(t, got, "last wipe (attested=true")
	require.Contains(t, got, "nvme-format")

	code, _, errs = cli("machines", "release", "m1", "--tenant", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "FAILED_PRECONDITION")
	require.Contains(t, errs, "release starts from deployed, rescue, failed")

	require.Contains(t, ok("machines", "retire", "m1", "--tenant", "acme"), "retired")
	require.Contains(t, ok("sites", "delete", "dc1", "--tenant", "acme"), "deleted dc1")
}

// TestMachineOperateCommands drives power, abort and workflows: a power
// cycle and its status, an abort refused with nothing running and one
// taken while a step is held in flight, and the workflows read back.
func TestMachineOperateCommands(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	dir := t.TempDir()
	env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: cp.AdminKey, "HOME": dir}
	cli := func(argv ...string) (int, string, string) {
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	ok := func(argv ...string) string {
		t.Helper()
		code, out, errs := cli(argv...)
		require.Equal(t, 0, code, "%v: %s", argv, errs)
		return out
	}
	ok("tenants", "create", "acme")
	var site struct{ Site struct{ Id string } }
	require.NoError(t, json.Unmarshal([]byte(ok("sites", "create", "dc1", "--tenant", "acme", "--networks", "127.0.0.0/8", "-o", "json")), &site))
	sim := bctest.NewSimSite(t, cp.App.Metal, site.Site.Id)
	sm := sim.AddMachine(t, "m1")
	pwFile := filepath.Join(dir, "bmc-password")
	require.NoError(t, os.WriteFile(pwFile, []byte(sm.Password), 0o600))
	ok("machines", "enroll", "m1", "--tenant", "acme", "--site", "dc1", "--bmc-driver", "redfish",
		"--bmc-address", sm.BMCAddress, "--bmc-username", sm.Username, "--bmc-password-file", pwFile, "--mac", sm.MAC)
	idle := func() {
		bctest.WaitFor(t, "m1's workflow to end", func() bool {
			var m struct{ Machine struct{ WorkflowId string } }
			require.NoError(t, json.Unmarshal([]byte(ok("machines", "get", "m1", "--tenant", "acme", "-o", "json")), &m))
			return m.Machine.WorkflowId == ""
		})
	}

	require.Contains(t, ok("machines", "power", "m1", "status", "--tenant", "acme"), "m1: power off")
	require.Contains(t, ok("machines", "power", "m1", "cycle", "--tenant", "acme"), "enrolled")
	idle()
	require.Contains(t, ok("machines", "power", "m1", "status", "--tenant", "acme"), "m1: power on")
	code, _, errs := cli("machines", "power", "m1", "reboot", "--tenant", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "INVALID_ARGUMENT")
	require.Contains(t, errs, "must be one of [cycle off on]")

	code, _, errs = cli("machines", "abort", "m1", "--tenant", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "no workflow is active to abort")
	release := sim.HoldNext("power.cycle")
	var cm struct{ Machine struct{ WorkflowId string } }
	require.NoError(t, json.Unmarshal([]byte(ok("machines", "commission", "m1", "--tenant", "acme", "-o", "json")), &cm))
	// Abort once the power cycle is dispatched and held: it is in flight.
	bctest.WaitFor(t, "the held power cycle to be dispatched", func() bool {
		var n int
		require.NoError(t, cp.App.DB.Read(t.Context(), func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM provision_steps WHERE workflow_id = $1 AND idx = 0 AND dispatched`,
				cm.Machine.WorkflowId).Scan(&n)
		}))
		return n == 1
	})
	require.Contains(t, ok("machines", "abort", "m1", "--tenant", "acme"), "cancel requested")
	release()
	idle()
	require.Contains(t, ok("machines", "get", "m1", "--tenant", "acme"), "the workflow was cancelled")

	list := ok("workflows", "list", "--tenant", "acme", "--machine", "m1")
	require.Contains(t, list, "power-cycle")
	require.Contains(t, list, "cancelled")
	var wfs struct {
		Workflows []struct{ Id, Operation string }
	}
	require.NoError(t, json.Unmarshal([]byte(ok("workflows", "list", "--tenant", "acme", "--state", "cancelled", "-o", "json")), &wfs))
	require.Len(t, wfs.Workflows, 1)
	require.Equal(t, "commission", wfs.Workflows[0].Operation)
	got := ok("workflows", "get", wfs.Workflows[0].Id, "--tenant", "acme")
	require.Contains(t, got, "commission of machine")
	require.Contains(t, got, "boot-ramdisk")
	require.Contains(t, got, "skipped")
	code, _, errs = cli("workflows", "get", "wf_nope", "--tenant", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "INVALID_ARGUMENT")
}

// TestMachineRotateBMCCommand drives rotate-bmc: a BMC whose driver sets
// no passwords is refused with the reason; a rotation shows its pending
// credential, and one that does not succeed (the site's agent does not
// know the BMC here) fails --wait,
// leaves the old credential current and the machine in maintenance, which
// refuses other operations and says so.
func TestMachineRotateBMCCommand(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	dir := t.TempDir()
	env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: cp.AdminKey, "HOME": dir}
	cli := func(argv ...string) (int, string, string) {
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	ok := func(argv ...string) string {
		t.Helper()
		code, out, errs := cli(argv...)
		require.Equal(t, 0, code, "%v: %s", argv, errs)
		return out
	}
	type machine struct {
		Machine struct {
			WorkflowId, BmcCredentialRef, BmcPendingCredentialRef, MaintenanceReason string
		}
	}
	get := func() machine {
		var m machine
		require.NoError(t, json.Unmarshal([]byte(ok("machines", "get", "m2", "--tenant", "acme", "-o", "json")), &m))
		return m
	}
	ok("tenants", "create", "acme")
	var site struct{ Site struct{ Id string } }
	require.NoError(t, json.Unmarshal([]byte(ok("sites", "create", "dc1", "--tenant", "acme", "--networks", "127.0.0.0/8", "-o", "json")), &site))
	sim := bctest.NewSimSite(t, cp.App.Metal, site.Site.Id)
	sm := sim.AddMachine(t, "m1")
	pwFile := filepath.Join(dir, "bmc-password")
	require.NoError(t, os.WriteFile(pwFile, []byte(sm.Password), 0o600))
	ok("machines", "enroll", "m1", "--tenant", "acme", "--site", "dc1", "--bmc-driver", "redfish",
		"--bmc-address", sm.BMCAddress, "--bmc-username", sm.Username, "--bmc-password-file", pwFile, "--mac", sm.MAC)
	code, _, errs := cli("machines", "rotate-bmc", "m1", "--tenant", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "FAILED_PRECONDITION")
	require.Contains(t, errs, "does not set passwords")

	// An IPMI machine no site agent of this test reaches: its rotation
	// waits to be dispatched until it is aborted.
	ok("machines", "enroll", "m2", "--tenant", "acme", "--site", "dc1", "--bmc-driver", "ipmi",
		"--bmc-address", "127.0.0.1:6230", "--bmc-username", "admin", "--bmc-password-file", pwFile, "--mac", "52:54:00:00:09:02")
	old := get().Machine.BmcCredentialRef
	out := ok("machines", "rotate-bmc", "m2", "--tenant", "acme", "-o", "json")
	var started machine
	require.NoError(t, json.Unmarshal([]byte(out), &started))
	require.NotEmpty(t, started.Machine.BmcPendingCredentialRef)
	require.NotEqual(t, old, started.Machine.BmcPendingCredentialRef)
	// The site's agent does not know m2's BMC: the step is refused and
	// the rotation fails.
	bctest.WaitFor(t, "the rotation to end", func() bool { return get().Machine.WorkflowId == "" })
	require.Contains(t, ok("machines", "get", "m2", "--tenant", "acme"), "in maintenance since")
	code, out, errs = cli("machines", "rotate-bmc", "m2", "--tenant", "acme", "--wait")
	require.Equal(t, 1, code, out)
	require.Contains(t, errs, "the old password stays current and the machine is in maintenance")

	m := get()
	require.Equal(t, old, m.Machine.BmcCredentialRef)
	require.Empty(t, m.Machine.BmcPendingCredentialRef)
	require.Contains(t, m.Machine.MaintenanceReason, "BMC password rotation failed")
	code, _, errs = cli("machines", "power", "m2", "on", "--tenant", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "is in maintenance")
}
