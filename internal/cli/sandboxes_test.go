package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
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

// TestSandboxCommands drives sandbox-templates and sandboxes against a real
// control plane and a simulated host running the fake hypervisor, with
// dev's catalog and dev's default template: create --wait returns a running
// sandbox; extend past the template's max is refused on --ttl; snapshot
// and delete answer; a template naming a missing secret is refused on its
// env field.
func TestSandboxCommands(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	require.NoError(t, devrig.EnsureInstanceCatalog(ctx, admin))
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "sim"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "sim", Name: "nodes"}))
	require.NoError(t, err)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, _ int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "sim", Project: "nodes"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	defer sim.Stop()
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "sim", Name: devrig.Pool,
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the host's GPUs", func() bool {
		var n int
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM gpus`).Scan(&n)
		}))
		return n == 8
	})
	require.NoError(t, devrig.EnsureSandboxTemplate(ctx, admin))
	require.NoError(t, devrig.EnsureSandboxTemplate(ctx, admin), "a restart finds the template")

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
	require.Contains(t, ok("sandbox-templates", "list", "--tenant", "sim"), devrig.SandboxTemplate)
	out := ok("sandboxes", "create", "--tenant", "sim", "--template", devrig.SandboxTemplate, "--wait", "1m")
	require.Contains(t, out, "running")
	id := strings.Fields(strings.Split(out, "\n")[1])[0]
	require.True(t, strings.HasPrefix(id, "sbx_"), "first column of %q", out)
	require.Contains(t, ok("sandboxes", "list", "--tenant", "sim"), id)
	require.Contains(t, ok("sandboxes", "extend", id, "--tenant", "sim", "--ttl", "2h"), id)
	code, _, errs := cli("sandboxes", "extend", id, "--tenant", "sim", "--ttl", "48h")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "--ttl")
	// exec runs through the API's tunnel to the fake guest's sshd.
	require.Equal(t, "hi there\n", ok("sandboxes", "exec", id, "--tenant", "sim", "--", "echo", "hi", "there"))
	code, _, _ = cli("sandboxes", "exec", id, "--tenant", "sim", "--", "exit 4")
	require.Equal(t, 4, code, "the remote exit code")
	out = ok("sandboxes", "exec", id, "--tenant", "sim", "-o", "json", "--", "echo", "it's")
	require.Contains(t, out, `"hostCertificate": "valid"`)
	require.Contains(t, out, `"stdout": "it's\n"`)
	code, _, errs = cli("sandboxes", "exec", id, "--tenant", "sim")
	require.NotEqual(t, 0, code)
	require.Contains(t, errs, "give the command after --")
	require.Contains(t, ok("sandboxes", "snapshot", id, "--tenant", "sim"), "sbs_")
	snapOut := ok("sandboxes", "snapshot", id, "--tenant", "sim", "-o", "json")
	snapID := regexp.MustCompile(`sbs_[0-9a-z]+`).FindString(snapOut)
	require.NotEmpty(t, snapID, snapOut)
	bctest.WaitFor(t, "the snapshot ready", func() bool {
		code, out, _ := cli("sandboxes", "restore", id, "--tenant", "sim", "--snapshot", snapID, "--wait", "1m")
		return code == 0 && strings.Contains(out, "running")
	})
	code, _, errs = cli("sandboxes", "restore", id, "--tenant", "sim", "--snapshot", "sbx_1")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "snapshot")
	// A kept snapshot outlives its sandbox and seeds a new one.
	keptID := regexp.MustCompile(`sbs_[0-9a-z]+`).FindString(ok("sandboxes", "snapshot", id, "--tenant", "sim", "--keep"))
	require.NotEmpty(t, keptID)
	bctest.WaitFor(t, "the kept snapshot ready", func() bool {
		return strings.Contains(ok("sandboxes", "snapshots", "list", "--tenant", "sim", "--sandbox", id), keptID+" ")
	})
	require.Contains(t, ok("sandboxes", "delete", id, "--tenant", "sim"), "deleted")
	bctest.WaitFor(t, "the kept snapshot ready", func() bool {
		out := ok("sandboxes", "snapshots", "list", "--tenant", "sim")
		return regexp.MustCompile(keptID + `\s+` + id + `\s+\S+\s+ready\s+true\s+`).MatchString(out)
	})
	out = ok("sandboxes", "create", "--tenant", "sim", "--template", devrig.SandboxTemplate, "--from-snapshot", keptID, "--wait", "1m")
	require.Contains(t, out, "running")
	from := strings.Fields(strings.Split(out, "\n")[1])[0]
	code, _, errs = cli("sandboxes", "create", "--tenant", "sim", "--template", devrig.SandboxTemplate, "--from-snapshot", "sbx_1")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "from-snapshot")
	require.Contains(t, ok("sandboxes", "snapshots", "delete", keptID, "--tenant", "sim"), "deleted "+keptID)
	require.NotContains(t, ok("sandboxes", "snapshots", "list", "--tenant", "sim"), keptID)
	require.Contains(t, ok("sandboxes", "delete", from, "--tenant", "sim"), "deleted")

	code, _, errs = cli("sandbox-templates", "create", "t2", "--tenant", "sim", "--flavor", devrig.Flavor, "--env", "K=secret://missing")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "env.K")
	code, _, errs = cli("sandbox-templates", "create", "t3", "--tenant", "sim", "--flavor", devrig.Flavor, "--env", "no-equals")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "--env")
	require.Contains(t, ok("sandbox-templates", "delete", devrig.SandboxTemplate, "--tenant", "sim"), "deleted")
}
