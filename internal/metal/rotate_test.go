package metal_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/metal"
)

// TestRotateBMCBadInput: a rotation of a machine that is not there, of a
// malformed reference, of a BMC whose driver sets no passwords, or of
// another tenant's machine is refused with its code (and field), and
// writes nothing: no pending credential, no workflow, no event.
func TestRotateBMCBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	m := f.enroll(t, f.sim.AddMachine(t, "m1")) // a Redfish BMC
	rotate := func(c interface {
		RotateBMCPassword(context.Context, *connect.Request[apiv1.RotateBMCPasswordRequest]) (*connect.Response[apiv1.RotateBMCPasswordResponse], error)
	}, tenant, machine string) error {
		_, err := c.RotateBMCPassword(ctx, connect.NewRequest(&apiv1.RotateBMCPasswordRequest{Tenant: tenant, Machine: machine}))
		return err
	}

	before := f.rows(t)
	refused(t, rotate(f.admin.Machines, "acme", "nope"), "NOT_FOUND", "", `machine "nope" not found`)
	refused(t, rotate(f.admin.Machines, "acme", "mch_"), "INVALID_ARGUMENT", "machine", "")
	refused(t, rotate(f.admin.Machines, "acme", "m1"), "FAILED_PRECONDITION", "machine", "does not set passwords")
	require.Equal(t, before, f.rows(t))
	require.Equal(t, 1, f.audited(t, "machines.rotateBMC", "FAILED_PRECONDITION"), "a refusal past authorization is audited")
	got := f.get(t, "m1")
	require.Empty(t, got.GetBmcPendingCredentialRef())
	require.Empty(t, got.GetWorkflowId())
	require.Empty(t, got.GetMaintenanceReason())
	require.Equal(t, m.GetBmcCredentialRef(), got.GetBmcCredentialRef())

	// Another tenant's admin: naming acme is denied before anything is
	// looked up; naming its own tenant, acme's machine is not found.
	_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "globex"}))
	require.NoError(t, err)
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "globex", Role: "admin"}))
	require.NoError(t, err)
	evil := f.cp.Client(k.Msg.GetSecret())
	before = f.rows(t)
	refused(t, rotate(evil.Machines, "acme", m.GetId()), "PERMISSION_DENIED", "", "")
	refused(t, rotate(evil.Machines, "acme", "mch_00000000000000000000000000"), "PERMISSION_DENIED", "", "")
	refused(t, rotate(evil.Machines, "globex", m.GetId()), "NOT_FOUND", "", "not found")
	require.Equal(t, before, f.rows(t))
	require.Empty(t, f.get(t, "m1").GetBmcPendingCredentialRef())
}

// TestGeneratePassword: generated BMC passwords are as long as asked,
// letters and digits with each class present, and differ.
func TestGeneratePassword(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 200 {
		pw, err := metal.GeneratePassword(16)
		require.NoError(t, err)
		require.Len(t, pw, 16)
		require.Regexp(t, `^[A-Za-z0-9]{16}$`, pw)
		require.Regexp(t, `[A-Z]`, pw)
		require.Regexp(t, `[a-z]`, pw)
		require.Regexp(t, `[0-9]`, pw)
		require.False(t, seen[pw])
		seen[pw] = true
	}
	_, err := metal.GeneratePassword(2)
	require.Error(t, err)
}
