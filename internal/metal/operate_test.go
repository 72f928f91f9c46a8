package metal_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/metal"
)

// TestPowerAbortWorkflows: power actions are one-step workflows that leave
// the machine's state alone, status asks the BMC through the site agent,
// abort cancels the active workflow (the machine ends failed once its step
// in flight ended), and the workflows read back with their steps.
func TestPowerAbortWorkflows(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	sm := f.sim.AddMachine(t, "m1")
	m := f.enroll(t, sm)
	status := func() string {
		t.Helper()
		r, err := f.admin.Machines.GetPowerStatus(ctx, connect.NewRequest(&apiv1.GetMachinePowerStatusRequest{Tenant: "acme", Machine: "m1"}))
		require.NoError(t, err)
		return r.Msg.GetPower()
	}
	require.Equal(t, "off", status())

	// Power on: the machine stays enrolled while the workflow runs and after.
	p, err := f.admin.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: "m1", Action: "on"}))
	require.NoError(t, err)
	require.Equal(t, "enrolled", p.Msg.GetMachine().GetState())
	require.Equal(t, metal.OpPowerOn, p.Msg.GetMachine().GetOperation())
	powerWf := p.Msg.GetMachine().GetWorkflowId()
	require.NotEmpty(t, powerWf)
	require.Equal(t, "enrolled", f.waitIdle(t, "m1").GetState())
	require.Equal(t, "on", status())
	_, err = f.admin.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: "m1", Action: "off"}))
	require.NoError(t, err)
	f.waitIdle(t, "m1")
	require.Equal(t, "off", status())
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM events WHERE resource_id = $1 AND type = 'machine.power_requested'`, m.GetId()))
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM events WHERE resource_id = $1 AND type = 'machine.power'`, m.GetId()))

	// The power-on workflow reads back with its one step.
	g, err := f.admin.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: "acme", Workflow: powerWf}))
	require.NoError(t, err)
	wf := g.Msg.GetWorkflow()
	require.Equal(t, "succeeded", wf.GetState())
	require.Equal(t, m.GetId(), wf.GetMachineId())
	require.Len(t, wf.GetSteps(), 1)
	require.Equal(t, metal.KindPowerOn, wf.GetSteps()[0].GetKind())
	require.Equal(t, "succeeded", wf.GetSteps()[0].GetState())
	require.EqualValues(t, 1, wf.GetSteps()[0].GetAttempts())
	require.NotNil(t, wf.GetSteps()[0].GetEndTime())

	// Abort: commission with its first power cycle held in flight; the
	// cancel waits for that step, then the machine is failed.
	release := f.sim.HoldNext(metal.KindPowerCycle)
	c, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	commissionWf := c.Msg.GetMachine().GetWorkflowId()
	bctest.WaitFor(t, "the held power cycle to be dispatched", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM provision_steps WHERE workflow_id = $1 AND idx = 0 AND dispatched`, commissionWf) == 1
	})
	// Busy: a power action is refused while the commission runs (the
	// commission itself goes on writing its own events).
	wfs := f.count(t, `SELECT COUNT(*) FROM provision_workflows`)
	_, err = f.admin.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: "m1", Action: "cycle"}))
	refused(t, err, "FAILED_PRECONDITION", "", "is active")
	require.Equal(t, wfs, f.count(t, `SELECT COUNT(*) FROM provision_workflows`))
	require.Equal(t, 1, f.audited(t, "machines.power", "FAILED_PRECONDITION"))
	a, err := f.admin.Machines.Abort(ctx, connect.NewRequest(&apiv1.AbortMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	require.Equal(t, commissionWf, a.Msg.GetWorkflow().GetId())
	require.True(t, a.Msg.GetWorkflow().GetCancelRequested())
	require.Equal(t, "commissioning", a.Msg.GetMachine().GetState())
	release()
	got := f.waitIdle(t, "m1")
	require.Equal(t, "failed", got.GetState())
	require.Equal(t, "the workflow was cancelled", got.GetFailureReason())
	require.Equal(t, 1, f.sim.MaxApplied(), "the held power cycle was applied once")

	g, err = f.admin.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: "acme", Workflow: commissionWf}))
	require.NoError(t, err)
	require.Equal(t, "cancelled", g.Msg.GetWorkflow().GetState())
	steps := g.Msg.GetWorkflow().GetSteps()
	require.Equal(t, "succeeded", steps[0].GetState(), "the step in flight ran to its end")
	require.Equal(t, "skipped", steps[len(steps)-1].GetState())

	// Lists: by machine, by state, paged.
	list := func(req *apiv1.ListMachineWorkflowsRequest) []*apiv1.MachineWorkflow {
		t.Helper()
		r, err := f.admin.Machines.ListWorkflows(ctx, connect.NewRequest(req))
		require.NoError(t, err)
		return r.Msg.GetWorkflows()
	}
	all := list(&apiv1.ListMachineWorkflowsRequest{Tenant: "acme", Machine: "m1"})
	require.Len(t, all, 3)
	require.Equal(t, []string{metal.OpPowerOn, metal.OpPowerOff, metal.OpCommission},
		[]string{all[0].GetOperation(), all[1].GetOperation(), all[2].GetOperation()})
	cancelled := list(&apiv1.ListMachineWorkflowsRequest{Tenant: "acme", State: "cancelled"})
	require.Len(t, cancelled, 1)
	require.Equal(t, commissionWf, cancelled[0].GetId())
	page, err := f.admin.Machines.ListWorkflows(ctx, connect.NewRequest(&apiv1.ListMachineWorkflowsRequest{Tenant: "acme", PageSize: 2}))
	require.NoError(t, err)
	require.Len(t, page.Msg.GetWorkflows(), 2)
	require.NotEmpty(t, page.Msg.GetNextPageToken())

	// A failed machine is brought back by commissioning it.
	_, err = f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	require.Equal(t, "ready", f.waitIdle(t, "m1").GetState())
}

// TestOperateBadInput: bad power actions, unknown machines and workflows,
// and an abort with nothing running are refused with their code and
// field, audited when they are mutations, and write nothing.
func TestOperateBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.enroll(t, f.sim.AddMachine(t, "m1"))

	before := f.rows(t)
	_, err := f.admin.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: "m1", Action: "status"}))
	refused(t, err, "INVALID_ARGUMENT", "action", "must be one of [cycle off on]")
	_, err = f.admin.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: "nope", Action: "on"}))
	refused(t, err, "NOT_FOUND", "", "nope")
	_, err = f.admin.Machines.Abort(ctx, connect.NewRequest(&apiv1.AbortMachineRequest{Tenant: "acme", Machine: "m1"}))
	refused(t, err, "FAILED_PRECONDITION", "", "no workflow is active to abort")
	_, err = f.admin.Machines.Abort(ctx, connect.NewRequest(&apiv1.AbortMachineRequest{Tenant: "acme", Machine: "nope"}))
	refused(t, err, "NOT_FOUND", "", "nope")
	require.Equal(t, before, f.rows(t))
	// The refusal after the decision is audited; a malformed request
	// (refused before any decision) and a miss are not, as for every
	// machine call (docs/metal.md).
	require.Equal(t, 1, f.audited(t, "machines.abort", "FAILED_PRECONDITION"))
	require.Equal(t, 0, f.audited(t, "machines.power", "INVALID_ARGUMENT"))
	require.Equal(t, 0, f.audited(t, "machines.power", "NOT_FOUND"))
	require.Equal(t, 0, f.audited(t, "machines.abort", "NOT_FOUND"))

	_, err = f.admin.Machines.GetPowerStatus(ctx, connect.NewRequest(&apiv1.GetMachinePowerStatusRequest{Tenant: "acme", Machine: "nope"}))
	refused(t, err, "NOT_FOUND", "", "nope")
	_, err = f.admin.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: "acme", Workflow: "m1"}))
	refused(t, err, "INVALID_ARGUMENT", "workflow", "is not a valid wf id")
	unknown := envelope.NewID("wf", f.cp.Clock.Now())
	_, err = f.admin.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: "acme", Workflow: unknown}))
	refused(t, err, "NOT_FOUND", "", unknown)
	_, err = f.admin.Machines.ListWorkflows(ctx, connect.NewRequest(&apiv1.ListMachineWorkflowsRequest{Tenant: "acme", State: "done"}))
	refused(t, err, "INVALID_ARGUMENT", "state", "must be one of")
	_, err = f.admin.Machines.ListWorkflows(ctx, connect.NewRequest(&apiv1.ListMachineWorkflowsRequest{Tenant: "acme", Machine: "nope"}))
	refused(t, err, "NOT_FOUND", "", "nope")
	require.Equal(t, before, f.rows(t))

	// Another tenant's workflow is not found from a tenant of its own.
	_, err = f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "globex"}))
	require.NoError(t, err)
	p, err := f.admin.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: "m1", Action: "on"}))
	require.NoError(t, err)
	_, err = f.admin.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: "globex",
		Workflow: p.Msg.GetMachine().GetWorkflowId()}))
	refused(t, err, "NOT_FOUND", "", "workflow")
	r, err := f.admin.Machines.ListWorkflows(ctx, connect.NewRequest(&apiv1.ListMachineWorkflowsRequest{Tenant: "globex"}))
	require.NoError(t, err)
	require.Empty(t, r.Msg.GetWorkflows())
}

// TestCrossTenantReadsAnswerAlike: another tenant's credentials get the same
// answer for acme's real site, machine and workflow ids as for made-up ones
// (PERMISSION_DENIED naming acme, NOT_FOUND under their own tenant), so the
// metal reads are no oracle of what exists.
func TestCrossTenantReadsAnswerAlike(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	m := f.enroll(t, f.sim.AddMachine(t, "m1"))
	p, err := f.admin.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: "m1", Action: "on"}))
	require.NoError(t, err)
	wf := p.Msg.GetMachine().GetWorkflowId()
	f.waitIdle(t, "m1")
	_, err = f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "globex"}))
	require.NoError(t, err)
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "globex", Role: "admin"}))
	require.NoError(t, err)
	evil := f.cp.Client(k.Msg.GetSecret())

	now := f.cp.Clock.Now()
	reads := map[string]func(tenant, id string) error{
		"workflow": func(tenant, id string) error {
			_, err := evil.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: tenant, Workflow: id}))
			return err
		},
		"machine": func(tenant, id string) error {
			_, err := evil.Machines.Get(ctx, connect.NewRequest(&apiv1.GetMachineRequest{Tenant: tenant, Machine: id}))
			return err
		},
		"power": func(tenant, id string) error {
			_, err := evil.Machines.GetPowerStatus(ctx, connect.NewRequest(&apiv1.GetMachinePowerStatusRequest{Tenant: tenant, Machine: id}))
			return err
		},
		"workflows": func(tenant, id string) error {
			_, err := evil.Machines.ListWorkflows(ctx, connect.NewRequest(&apiv1.ListMachineWorkflowsRequest{Tenant: tenant, Machine: id}))
			return err
		},
		"site": func(tenant, id string) error {
			_, err := evil.Sites.Get(ctx, connect.NewRequest(&apiv1.GetSiteRequest{Tenant: tenant, Site: id}))
			return err
		},
	}
	ids := map[string][2]string{ // real, made up
		"workflow":  {wf, envelope.NewID(metal.WorkflowIDPrefix, now)},
		"machine":   {m.GetId(), envelope.NewID(metal.MachineIDPrefix, now)},
		"power":     {m.GetId(), envelope.NewID(metal.MachineIDPrefix, now)},
		"workflows": {m.GetId(), envelope.NewID(metal.MachineIDPrefix, now)},
		"site":      {f.site.GetId(), envelope.NewID(metal.SiteIDPrefix, now)},
	}
	for name, read := range reads {
		real, madeUp := ids[name][0], ids[name][1]
		for tenant, want := range map[string]string{"acme": "PERMISSION_DENIED", "globex": "NOT_FOUND", "": "NOT_FOUND"} {
			errReal, errMadeUp := read(tenant, real), read(tenant, madeUp)
			require.Equal(t, want, client.Code(errReal), "%s in %q, real id: %v", name, tenant, errReal)
			require.Equal(t, want, client.Code(errMadeUp), "%s in %q, made-up id: %v", name, tenant, errMadeUp)
			if want == "PERMISSION_DENIED" {
				require.Equal(t, client.Detail(errReal).GetMessage(), client.Detail(errMadeUp).GetMessage(), "%s in %q", name, tenant)
			}
		}
	}
}
