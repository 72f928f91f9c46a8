package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/devrig"
	"github.com/better-compute/better-compute/internal/store"
)

// TestInstanceCommands drives instances and volumes against a real control
// plane and a simulated host running the fake hypervisor, with dev's
// catalog: create --wait returns once the guest runs and its SSH address
// answers; stop, start and delete wait for their states; refusals name
// their field.
func TestInstanceCommands(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	require.NoError(t, devrig.EnsureInstanceCatalog(ctx, admin))
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, _ int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	defer sim.Stop()
	bctest.WaitFor(t, "the host's GPUs", func() bool {
		var n int
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM gpus`).Scan(&n)
		}))
		return n == 8
	})
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "gpu",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)

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
	// Every default at once: dev's flavor, the only IP pool, guest image
	// and capacity pool.
	out := ok("instances", "create", "vm1", "--tenant", "acme", "--flavor", devrig.Flavor, "--volume", "data:5", "--wait", "2m")
	require.Contains(t, out, "running")
	require.Contains(t, out, "10.100.0.2")
	require.Contains(t, ok("instances", "list", "--tenant", "acme"), "vm1")
	require.Contains(t, ok("volumes", "list", "--tenant", "acme"), "attached")
	require.Contains(t, ok("instances", "stop", "vm1", "--tenant", "acme", "--wait", "1m"), "stopped")
	require.Contains(t, ok("instances", "start", "vm1", "--tenant", "acme", "--wait", "1m"), "running")
	require.Equal(t, "bc-guest\n", ok("instances", "ssh", "vm1", "--tenant", "acme", "--", "echo bc-guest"))
	require.Contains(t, ok("volumes", "detach", "data", "--tenant", "acme", "--wait", "1m"), "available")
	require.Contains(t, ok("volumes", "attach", "data", "--instance", "vm1", "--tenant", "acme", "--wait", "1m"), "attached")
	code, _, errs := cli("volumes", "attach", "data", "--tenant", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "instance")

	code, _, errs = cli("instances", "create", "vm2", "--tenant", "acme", "--flavor", devrig.Flavor, "--network-policy", "open")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "network-policy")
	code, _, errs = cli("instances", "create", "vm2", "--tenant", "acme", "--flavor", devrig.Flavor, "--on-host-lost", "resurrect")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "on-host-lost")
	code, _, errs = cli("instances", "create", "vm2", "--tenant", "acme", "--flavor", devrig.Flavor, "--volume", "bad")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "volume")

	require.Contains(t, ok("instances", "delete", "vm1", "--tenant", "acme", "--wait", "1m"), "deleted")
	require.Contains(t, ok("volumes", "get", "data", "--tenant", "acme"), "available")
	require.Contains(t, ok("volumes", "delete", "data", "--tenant", "acme"), "deleting")
}
