package mcp_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/mcp"
)

// workloads gives setup's fixture what instances and sandboxes need: the
// platform's flavor and IP pool, and acme's sandbox template box.
func (f *fixture) workloads(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	_, err := f.admin.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Name: "small", Vcpus: 2, MemoryMib: 2048, DiskGib: 20}))
	require.NoError(t, err)
	_, err = f.admin.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: "dev", Cidr: "10.100.0.0/24"}))
	require.NoError(t, err)
	_, err = f.admin.SandboxTemplates.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxTemplateRequest{Tenant: "acme", Name: "box",
		Flavor: "small", Image: "debian-12", Pool: "gpus", IpPool: "dev", DefaultTtl: durationpb.New(10 * time.Minute),
		MaxTtl: durationpb.New(time.Hour)}))
	require.NoError(t, err)
}

// TestMCPWorkloads: an agent creates an instance and waits for it to run,
// then a sandbox, runs a command in it through the SSH tunnel, extends it;
// deleting needs a human; another tenant's agent finds none of it.
func TestMCPWorkloads(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.workloads(t)
	cs := f.httpSession(t, f.acmeAgent)

	var in mcp.InstanceOutput
	res := call(t, cs, "create_instance", map[string]any{"name": "vm1", "flavor": "small", "pool": "gpus", "ip_pool": "dev",
		"image": "debian-12", "wait": "2m"}, &in)
	require.False(t, res.IsError, "%v", res.Content)
	require.Equal(t, "running", in.Instance.State, "create_instance waits for the instance to run")
	require.NotEmpty(t, in.Instance.Address)

	var sb mcp.SandboxOutput
	res = call(t, cs, "create_sandbox", map[string]any{"template": "box"}, &sb)
	require.False(t, res.IsError, "%v", res.Content)
	require.Equal(t, "running", sb.Sandbox.State)

	var out mcp.ExecOutput
	f.cp.Clock.CatchUp() // the tunnel's deadline counts from the control plane's clock
	res = call(t, cs, "exec_sandbox", map[string]any{"sandbox": sb.Sandbox.ID, "command": "echo hi; exit 3"}, &out)
	require.False(t, res.IsError, "%v", res.Content)
	require.Equal(t, 3, out.ExitCode)
	require.Equal(t, "hi\n", out.Stdout)

	before := sb.Sandbox.Expires
	res = call(t, cs, "extend_sandbox", map[string]any{"sandbox": sb.Sandbox.ID, "by": "10m"}, &sb)
	require.False(t, res.IsError, "%v", res.Content)
	require.Greater(t, sb.Sandbox.Expires, before)

	// Another tenant's agent: acme's sandbox and instance are not there.
	evil := f.httpSession(t, f.other)
	r := refused(t, evil, "exec_sandbox", map[string]any{"sandbox": sb.Sandbox.ID, "command": "id"})
	require.Equal(t, "NOT_FOUND", r.Code, r.Message)
	r = refused(t, evil, "delete_instance", map[string]any{"instance": in.Instance.ID})
	require.Contains(t, []string{"NOT_FOUND", "PERMISSION_DENIED"}, r.Code, r.Message)

	// Bad input names the argument.
	r = refused(t, cs, "exec_sandbox", map[string]any{"sandbox": sb.Sandbox.ID, "command": ""})
	require.Equal(t, "INVALID_ARGUMENT", r.Code)
	require.Equal(t, "command", r.Violations[0].Field)

	// An agent's delete waits for a human.
	r = refused(t, cs, "delete_sandbox", map[string]any{"sandbox": sb.Sandbox.ID})
	require.Equal(t, mcp.CodeConfirmationRequired, r.Code, r.Message)
}
