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

// TestWorkflowControlCommands drives workflows pause, resume, retry --from
// and abort on a simulated site: a commission paused while its inventory
// is held, resumed to ready; refusals with their reasons; an inspect
// aborted by its workflow id.
func TestWorkflowControlCommands(t *testing.T) {
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
	fails := func(want string, argv ...string) {
		t.Helper()
		code, _, errs := cli(argv...)
		require.Equal(t, 1, code, "%v", argv)
		require.Contains(t, errs, want)
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
	dispatched := func(wf, step string) {
		bctest.WaitFor(t, step+" to be dispatched", func() bool {
			var n int
			require.NoError(t, cp.App.DB.Read(t.Context(), func(ctx context.Context, tx store.Tx) error {
				return tx.QueryRow(ctx, `SELECT COUNT(*) FROM provision_steps WHERE workflow_id = $1 AND name = $2 AND dispatched`,
					wf, step).Scan(&n)
			}))
			return n == 1
		})
	}

	release := sim.HoldNext("inventory.refresh")
	var cm struct{ Machine struct{ WorkflowId string } }
	require.NoError(t, json.Unmarshal([]byte(ok("machines", "commission", "m1", "--tenant", "acme", "-o", "json")), &cm))
	wf := cm.Machine.WorkflowId
	dispatched(wf, "inventory")
	out := ok("workflows", "pause", wf, "--tenant", "acme")
	require.Contains(t, out, "commissioning")
	require.Contains(t, out, "paused")
	fails("from_step", "workflows", "retry", wf, "--tenant", "acme")
	fails("step inventory is running; wait for it to end", "workflows", "retry", wf, "--from", "inventory", "--tenant", "acme")
	release()
	require.Contains(t, ok("workflows", "resume", wf, "--tenant", "acme"), "resumed")
	idle()
	require.Contains(t, ok("machines", "get", "m1", "--tenant", "acme"), "ready")
	fails("nothing to retry", "workflows", "retry", wf, "--from", "wipe", "--tenant", "acme")
	fails("not paused", "workflows", "resume", wf, "--tenant", "acme")
	fails("nothing to abort", "workflows", "abort", wf, "--tenant", "acme")

	hold := sim.HoldNext("power.cycle")
	require.NoError(t, json.Unmarshal([]byte(ok("machines", "inspect", "m1", "--tenant", "acme", "-o", "json")), &cm))
	dispatched(cm.Machine.WorkflowId, "boot-ramdisk")
	require.Contains(t, ok("workflows", "abort", cm.Machine.WorkflowId, "--tenant", "acme"), "cancel requested")
	hold()
	idle()
	require.Contains(t, ok("machines", "get", "m1", "--tenant", "acme"), "the workflow was cancelled")
	fails("was cancelled", "workflows", "retry", cm.Machine.WorkflowId, "--from", "boot-ramdisk", "--tenant", "acme")
}
