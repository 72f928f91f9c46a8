package site_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// ipmiMachine starts ipmi_sim as a machine's BMC and enrolls the machine
// at dc1 with it.
func (f *fixture) ipmiMachine(t *testing.T, name, mac, password string) *bctest.IPMISim {
	t.Helper()
	sim := bctest.StartIPMISim(t, "admin", password)
	_, err := f.admin.Machines.Enroll(context.Background(), connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme",
		Site: "dc1", Name: name, BmcDriver: "ipmi", BmcAddress: sim.Address, BmcUsername: "admin", BmcPassword: password,
		Mac: mac, HardwareProfile: "test"}))
	require.NoError(t, err)
	return sim
}

func (f *fixture) getMachine(t *testing.T, name string) *apiv1.Machine {
	t.Helper()
	m, err := f.admin.Machines.Get(context.Background(), connect.NewRequest(&apiv1.GetMachineRequest{Tenant: "acme", Machine: name}))
	require.NoError(t, err)
	return m.Msg.GetMachine()
}

// rotate starts a rotation and waits for its workflow to end.
func (f *fixture) rotate(t *testing.T, name string) (*apiv1.Machine, provision.Workflow) {
	t.Helper()
	res, err := f.admin.Machines.RotateBMCPassword(context.Background(), connect.NewRequest(&apiv1.RotateBMCPasswordRequest{Tenant: "acme", Machine: name}))
	require.NoError(t, err)
	started := res.Msg.GetMachine()
	require.NotEmpty(t, started.GetWorkflowId())
	require.NotEmpty(t, started.GetBmcPendingCredentialRef())
	require.NotEqual(t, started.GetBmcCredentialRef(), started.GetBmcPendingCredentialRef())
	bctest.WaitFor(t, "the rotation to end", func() bool { return f.getMachine(t, name).GetWorkflowId() == "" })
	return started, f.workflow(t, name)
}

// TestSiteAgentRotatesBMCPassword: a rotation goes control plane → gateway
// → site agent → ipmi_sim by reference only; the agent sets the new
// password, logs in with it and signs its success, and only then is the
// new password current: the emulator takes it and refuses the old one.
func TestSiteAgentRotatesBMCPassword(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const old = "Enrolled-pw-0001"
	sim := f.ipmiMachine(t, "m1", "52:54:00:00:03:01", old)
	sa := startSiteAgent(t, f.cp, t.TempDir(), f.siteToken(t, "dc1"))
	bctest.WaitFor(t, "the machine list to reach the site agent", func() bool { return len(sa.site.Machines()) == 1 })

	started, w := f.rotate(t, "m1")
	require.Equal(t, provision.WorkflowSucceeded, w.State, w.Reason)
	m := f.getMachine(t, "m1")
	require.Equal(t, started.GetBmcPendingCredentialRef(), m.GetBmcCredentialRef(), "the pending credential is current")
	require.Empty(t, m.GetBmcPendingCredentialRef())
	require.Empty(t, m.GetMaintenanceReason())
	require.Equal(t, "enrolled", m.GetState(), "the machine keeps its state")

	require.Error(t, sim.Login("admin", old), "the BMC refuses the old password")
	// The control plane's current password is the one the BMC now takes:
	// a power read through the site agent logs in with it.
	_, err := f.cp.App.Metal.PowerStatus(context.Background(), m.GetId())
	require.NoError(t, err)

	var params string
	var reports []fleet.NodeReport
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		if err := tx.QueryRow(ctx, `SELECT params FROM commands WHERE kind = $1`, metal.CommandBMCRotate).Scan(&params); err != nil {
			return err
		}
		reports, err = fleet.NodeReportsFor(ctx, tx, step(w, "rotate-bmc").Handle)
		return err
	}))
	require.NotContains(t, params, "password", "the command row names both passwords by reference only")
	require.NotContains(t, params, old)
	require.NotContains(t, params, "sealed")
	require.Contains(t, params, started.GetBmcPendingCredentialRef())
	require.Len(t, reports, 1, "the agent's signed success is kept")
	require.Equal(t, "command.succeeded", reports[0].Kind)
	require.NotContains(t, string(reports[0].Signed), old, "the signed report carries no password")
}

// TestSiteAgentRotationFails: a BMC that does not answer refuses the set,
// and a BMC that takes the new password but then logs in with neither
// (ipmi_sim keeps the tail of a 17-20 byte password when a 16-byte one is
// set) fails the login check. Either way the old password stays current,
// nothing is pending, and the machine is in maintenance with the reason;
// it runs no other workflow until a rotation succeeds.
func TestSiteAgentRotationFails(t *testing.T) {
	t.Parallel()
	f := setup(t)
	down := f.ipmiMachine(t, "m1", "52:54:00:00:04:01", "Enrolled-pw-0002")
	long := f.ipmiMachine(t, "m2", "52:54:00:00:04:02", "Enrolled-pw-17byte")
	sa := startSiteAgent(t, f.cp, t.TempDir(), f.siteToken(t, "dc1"))
	bctest.WaitFor(t, "the machine list to reach the site agent", func() bool { return len(sa.site.Machines()) == 2 })

	down.Stop()
	started, w := f.rotate(t, "m1")
	require.Equal(t, provision.WorkflowFailed, w.State)
	m := f.getMachine(t, "m1")
	require.Equal(t, started.GetBmcCredentialRef(), m.GetBmcCredentialRef(), "the old password stays current")
	require.Empty(t, m.GetBmcPendingCredentialRef(), "the pending slot is cleared")
	require.Contains(t, m.GetMaintenanceReason(), "setting the new password failed; the old one stays")
	require.NotNil(t, m.GetMaintenanceTime())

	started, w = f.rotate(t, "m2")
	require.Equal(t, provision.WorkflowFailed, w.State)
	m = f.getMachine(t, "m2")
	require.Equal(t, started.GetBmcCredentialRef(), m.GetBmcCredentialRef(), "the old password stays current")
	require.Empty(t, m.GetBmcPendingCredentialRef())
	require.Contains(t, m.GetMaintenanceReason(), "the BMC accepted the new password but it does not log in")
	require.Contains(t, m.GetMaintenanceReason(), "the BMC may hold the new password")
	require.Error(t, long.Login("admin", "Enrolled-pw-17byte"))

	_, err := f.admin.Machines.Commission(context.Background(), connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.Contains(t, err.Error(), "is in maintenance")
	_, err = f.admin.Machines.Power(context.Background(), connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: "m1", Action: "on"}))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
}

// TestRotationNeedsTheAgentsSignature: a success that does not come as the
// site agent's signed final update — here a result handed to the engine
// directly, as a replica or a database writer could — is not taken: the
// old password stays current and the machine goes into maintenance.
func TestRotationNeedsTheAgentsSignature(t *testing.T) {
	t.Parallel()
	f := setup(t)
	sim := f.ipmiMachine(t, "m1", "52:54:00:00:05:01", "Enrolled-pw-0003")
	sa := startSiteAgent(t, f.cp, t.TempDir(), f.siteToken(t, "dc1"))
	bctest.WaitFor(t, "the machine list to reach the site agent", func() bool { return len(sa.site.Machines()) == 1 })
	// The agent goes away while its lease is still live: the command is
	// queued for it and never applied.
	sa.stop()

	res, err := f.admin.Machines.RotateBMCPassword(context.Background(), connect.NewRequest(&apiv1.RotateBMCPasswordRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	started := res.Msg.GetMachine()
	var key string
	bctest.WaitFor(t, "the rotation to be dispatched", func() bool {
		// One read: the key and the dispatch of the same step row.
		s := step(f.workflow(t, "m1"), "rotate-bmc")
		key = s.IdempotencyKey
		return s.Dispatched
	})
	require.NoError(t, f.cp.App.Metal.Complete(context.Background(), key, provision.Result{Output: map[string]any{
		"login_verified": true, "pending_ref": started.GetBmcPendingCredentialRef()}}))
	bctest.WaitFor(t, "the rotation to end", func() bool { return f.getMachine(t, "m1").GetWorkflowId() == "" })

	m := f.getMachine(t, "m1")
	require.Equal(t, started.GetBmcCredentialRef(), m.GetBmcCredentialRef(), "the old password stays current")
	require.Empty(t, m.GetBmcPendingCredentialRef())
	require.Contains(t, m.GetMaintenanceReason(), "no node-signed success report")
	require.NoError(t, sim.Login("admin", "Enrolled-pw-0003"), "the BMC was never touched")
}
