package metal_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// stepState reads one step of a workflow by name: its state and failures,
// in one query (a step moving between two reads must not look like two).
func (f *fixture) stepState(t *testing.T, wf, name string) (state string, failures int) {
	t.Helper()
	var rows int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		rs, err := tx.Query(ctx, `SELECT state, failures FROM provision_steps WHERE workflow_id = $1 AND name = $2 AND phase = 'main'`, wf, name)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			rows++
			if err := rs.Scan(&state, &failures); err != nil {
				return err
			}
		}
		return rs.Err()
	}))
	require.Equal(t, 1, rows, "step %s of %s", name, wf)
	return state, failures
}

func (f *fixture) waitStep(t *testing.T, wf, name, want string) {
	t.Helper()
	bctest.WaitFor(t, fmt.Sprintf("step %s of %s to be %s", name, wf, want), func() bool {
		got, _ := f.stepState(t, wf, name)
		return got == want
	})
}

// failPowerOff fails a workflow's power-off for good: FailNext must have
// been set for its first attempt; its two retries fail too.
func (f *fixture) failPowerOff(t *testing.T, wf string) {
	t.Helper()
	for fails := 1; fails < 3; fails++ {
		bctest.WaitFor(t, "power-off to fail", func() bool {
			_, n := f.stepState(t, wf, "power-off")
			return n == fails
		})
		f.sim.FailNext(metal.KindPowerOff, "bmc said no")
		f.cp.Clock.Advance(time.Duration(fails) * 11 * time.Second) // past the backoff
		require.NoError(t, f.cp.App.Metal.Engine.Reconcile(context.Background(), wf))
	}
}

func (f *fixture) workflow(t *testing.T, wf string) *apiv1.MachineWorkflow {
	t.Helper()
	g, err := f.admin.Machines.GetWorkflow(context.Background(), connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
	require.NoError(t, err)
	return g.Msg.GetWorkflow()
}

// TestWorkflowPauseResume: a pause lets the step in flight end and records
// it, starts nothing further (not even past the step's deadline), and
// keeps the machine commissioning; a resume finishes the workflow.
func TestWorkflowPauseResume(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	sm := f.sim.AddMachine(t, "m1")
	f.enroll(t, sm)
	release := f.sim.HoldNext(metal.KindInventory)
	c, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	wf := c.Msg.GetMachine().GetWorkflowId()
	bctest.WaitFor(t, "the held inventory to be dispatched", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM provision_steps WHERE workflow_id = $1 AND name = 'inventory' AND dispatched`, wf) == 1
	})

	p, err := f.admin.Machines.PauseWorkflow(ctx, connect.NewRequest(&apiv1.PauseMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
	require.NoError(t, err)
	require.Equal(t, "paused", p.Msg.GetWorkflow().GetState())
	require.Equal(t, "commissioning", p.Msg.GetMachine().GetState())
	require.Equal(t, 1, f.audited(t, "machines.pauseWorkflow", "OK"))

	// Past the inventory's 10-minute deadline: a paused workflow is not
	// timed out by it, whoever looks.
	f.cp.Clock.Advance(11 * time.Minute)
	require.NoError(t, f.cp.App.Metal.Engine.Reconcile(ctx, wf))
	n, err := f.cp.App.Metal.Engine.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a paused workflow's deadline is not due")
	state, failures := f.stepState(t, wf, "inventory")
	require.Equal(t, "running", state)
	require.Zero(t, failures)

	// The step in flight ends and is recorded; the next one does not start.
	release()
	f.waitStep(t, wf, "inventory", "succeeded")
	require.NoError(t, f.cp.App.Metal.Engine.Reconcile(ctx, wf))
	state, _ = f.stepState(t, wf, "wipe")
	require.Equal(t, "pending", state)
	require.Equal(t, "paused", f.workflow(t, wf).GetState())
	require.Equal(t, "commissioning", f.get(t, "m1").GetState())
	require.Zero(t, sm.Wipes())

	r, err := f.admin.Machines.ResumeWorkflow(ctx, connect.NewRequest(&apiv1.ResumeMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
	require.NoError(t, err)
	require.NotEqual(t, "paused", r.Msg.GetWorkflow().GetState())
	m := f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.Equal(t, 1, sm.Wipes())
	require.Equal(t, 1, f.sim.MaxApplied())

	// A finished workflow is neither paused, resumed, retried nor aborted.
	_, err = f.admin.Machines.PauseWorkflow(ctx, connect.NewRequest(&apiv1.PauseMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
	refused(t, err, "FAILED_PRECONDITION", "", "only a pending or running workflow can be paused")
	_, err = f.admin.Machines.ResumeWorkflow(ctx, connect.NewRequest(&apiv1.ResumeMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
	refused(t, err, "FAILED_PRECONDITION", "", "not paused")
	_, err = f.admin.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: wf, FromStep: "wipe"}))
	refused(t, err, "FAILED_PRECONDITION", "", "succeeded: there is nothing to retry")
	_, err = f.admin.Machines.AbortWorkflow(ctx, connect.NewRequest(&apiv1.AbortMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
	refused(t, err, "FAILED_PRECONDITION", "", "not machine m1's active workflow")
	require.Equal(t, 1, sm.Wipes())
	require.Equal(t, 1, f.audited(t, "machines.retryWorkflow", "FAILED_PRECONDITION"))
}

// TestWorkflowRetryFailedStep: a step that failed for good is retried from
// itself; the steps before it are not run again, and it runs under a new
// key. Bad retries are refused with their field and reason, and change
// nothing; another tenant's admin finds no such workflow.
func TestWorkflowRetryFailedStep(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	sm := f.sim.AddMachine(t, "m1")
	f.enroll(t, sm)
	// power-off has two retries: it fails for good on its third failure.
	f.sim.FailNext(metal.KindPowerOff, "bmc said no")
	in, err := f.admin.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	wf := in.Msg.GetMachine().GetWorkflowId()
	f.failPowerOff(t, wf)
	m := f.waitIdle(t, "m1")
	require.Equal(t, "failed", m.GetState())
	require.Equal(t, "power-off", m.GetFailedStep())
	key := func(idx, attempt int) string { return provision.IdempotencyKey(wf, idx, attempt) }
	require.Equal(t, 1, f.sim.Applied(key(3, 3)))

	// Refusals: each says which field and why, and leaves the workflow and
	// the machine as they were.
	retry := func(tenant, id, from string) error {
		_, err := f.admin.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: tenant, Workflow: id, FromStep: from}))
		return err
	}
	mid := f.get(t, "m1").GetId()
	written := func() int {
		return f.count(t, `SELECT COUNT(*) FROM events WHERE resource_id IN ($1, $2)`, wf, mid)
	}
	events := written()
	refused(t, retry("acme", wf, ""), "INVALID_ARGUMENT", "from_step", "is required")
	refused(t, retry("acme", wf, "nope"), "INVALID_ARGUMENT", "from_step", `names no step of profile inspect: "nope"`)
	refused(t, retry("acme", wf, "inventory"), "INVALID_ARGUMENT", "from_step", "runs in the machine's ramdisk")
	refused(t, retry("acme", envelope.NewID("wf", time.Now()), "power-off"), "NOT_FOUND", "", "workflow")
	refused(t, retry("acme", "mch_nope", "power-off"), "INVALID_ARGUMENT", "workflow", "")
	_, err = f.admin.Machines.PauseWorkflow(ctx, connect.NewRequest(&apiv1.PauseMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
	refused(t, err, "FAILED_PRECONDITION", "", "is failed")
	_, err = f.admin.Machines.ResumeWorkflow(ctx, connect.NewRequest(&apiv1.ResumeMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
	refused(t, err, "FAILED_PRECONDITION", "", "not paused")

	_, err = f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "globex"}))
	require.NoError(t, err)
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "globex", Role: "admin"}))
	require.NoError(t, err)
	evil := f.cp.Client(k.Msg.GetSecret())
	for _, tenant := range []string{"globex", ""} {
		_, err = evil.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: tenant, Workflow: wf, FromStep: "power-off"}))
		refused(t, err, "NOT_FOUND", "", "workflow")
		_, err = evil.Machines.AbortWorkflow(ctx, connect.NewRequest(&apiv1.AbortMachineWorkflowRequest{Tenant: tenant, Workflow: wf}))
		refused(t, err, "NOT_FOUND", "", "workflow")
		_, err = evil.Machines.PauseWorkflow(ctx, connect.NewRequest(&apiv1.PauseMachineWorkflowRequest{Tenant: tenant, Workflow: wf}))
		refused(t, err, "NOT_FOUND", "", "workflow")
	}
	_, err = evil.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: wf, FromStep: "power-off"}))
	require.Contains(t, []string{"PERMISSION_DENIED", "NOT_FOUND"}, client.Code(err))
	// Refusals are audited; nothing of the workflow or the machine changed.
	require.Equal(t, events, written())
	require.Zero(t, f.count(t, `SELECT restarts FROM provision_workflows WHERE id = $1`, wf))
	require.Equal(t, "failed", f.workflow(t, wf).GetState())
	require.Equal(t, "failed", f.get(t, "m1").GetState())

	// Retry from the failed step: the machine is inspecting again, and only
	// power-off runs, under a key never used.
	r, err := f.admin.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: wf, FromStep: "power-off"}))
	require.NoError(t, err)
	require.Equal(t, "inspecting", r.Msg.GetMachine().GetState())
	require.Equal(t, wf, r.Msg.GetMachine().GetWorkflowId())
	require.Equal(t, "running", r.Msg.GetWorkflow().GetState())
	require.Empty(t, r.Msg.GetWorkflow().GetFailedStep())
	m = f.waitIdle(t, "m1")
	require.Equal(t, "enrolled", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.Empty(t, m.GetFailureReason())
	require.Equal(t, 1, f.sim.Applied(key(0, 1)), "the ramdisk boot ran once")
	require.Zero(t, f.sim.Applied(key(0, 2)))
	require.Equal(t, 1, f.sim.Applied(key(2, 1)), "the inventory ran once")
	require.Zero(t, f.sim.Applied(key(2, 2)))
	require.Equal(t, 1, f.sim.Applied(key(3, 4)), "power-off ran again under its fourth key")
	require.Equal(t, 1, f.sim.MaxApplied())
	steps := f.workflow(t, wf).GetSteps()
	require.Equal(t, "succeeded", steps[3].GetState())
	require.EqualValues(t, 4, steps[3].GetAttempts())
	require.Zero(t, steps[3].GetFailures(), "a retry has a fresh budget")
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE resource_id = $1 AND type = 'workflow.retried'`, wf))
	require.Equal(t, 1, f.count(t, `SELECT restarts FROM provision_workflows WHERE id = $1`, wf))
}

// TestWorkflowRetryEarlierStep: a commission whose burn-in failed is retried
// from its ramdisk boot: every step from there runs again (a second wipe,
// attested by the new ramdisk), each under a new key.
func TestWorkflowRetryEarlierStep(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	sm := f.sim.AddMachine(t, "m1")
	f.enroll(t, sm)
	f.sim.FailNext(metal.KindBurnIn, "gpu 3 fell off the bus")
	c, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1", BurnIn: true}))
	require.NoError(t, err)
	wf := c.Msg.GetMachine().GetWorkflowId()
	m := f.waitIdle(t, "m1")
	require.Equal(t, "failed", m.GetState())
	require.Equal(t, "burn-in", m.GetFailedStep())
	require.Equal(t, 1, sm.Wipes())

	_, err = f.admin.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: wf, FromStep: "power-off"}))
	refused(t, err, "INVALID_ARGUMENT", "from_step", "step inventory's signed record is checked with the key of the ramdisk")
	r, err := f.admin.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: wf, FromStep: "boot-ramdisk"}))
	require.NoError(t, err)
	require.Equal(t, "commissioning", r.Msg.GetMachine().GetState())
	m = f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.Equal(t, 2, sm.Wipes())
	require.NotNil(t, m.GetEraseRecord())
	for idx := 0; idx < 5; idx++ {
		if idx == 1 {
			continue // ramdisk-joined is an await step: nothing is applied
		}
		require.Equal(t, 1, f.sim.Applied(provision.IdempotencyKey(wf, idx, 2)), "step %d ran again under a new key", idx)
	}
	// power-off was skipped by the failure: this was its first run.
	require.Equal(t, 1, f.sim.Applied(provision.IdempotencyKey(wf, 5, 1)))
	require.Equal(t, 1, f.sim.MaxApplied())
}

// TestWorkflowRetryPausedAndAbort: a paused workflow is retried from an
// earlier step (its ramdisk still up), and a workflow is aborted by its
// id as machines abort would.
func TestWorkflowRetryPausedAndAbort(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	sm := f.sim.AddMachine(t, "m1")
	f.enroll(t, sm)
	release := f.sim.HoldNext(metal.KindDiskWipe)
	c, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	wf := c.Msg.GetMachine().GetWorkflowId()
	f.waitStep(t, wf, "wipe", "running")
	_, err = f.admin.Machines.PauseWorkflow(ctx, connect.NewRequest(&apiv1.PauseMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
	require.NoError(t, err)
	_, err = f.admin.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: wf, FromStep: "inventory"}))
	refused(t, err, "FAILED_PRECONDITION", "", "step wipe is running; wait for it to end")
	release()
	f.waitStep(t, wf, "wipe", "succeeded")
	_, err = f.admin.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: wf, FromStep: "power-off"}))
	refused(t, err, "INVALID_ARGUMENT", "from_step", "comes after step burn-in, which has not run")
	r, err := f.admin.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: wf, FromStep: "inventory"}))
	require.NoError(t, err)
	require.Equal(t, "commissioning", r.Msg.GetMachine().GetState())
	m := f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.Equal(t, 2, sm.Wipes(), "the wipe ran again")
	require.Equal(t, 1, f.sim.Applied(provision.IdempotencyKey(wf, 0, 1)))
	require.Zero(t, f.sim.Applied(provision.IdempotencyKey(wf, 0, 2)), "the boot before inventory did not run again")
	require.Equal(t, 1, f.sim.Applied(provision.IdempotencyKey(wf, 2, 2)))
	require.Equal(t, 1, f.sim.Applied(provision.IdempotencyKey(wf, 3, 2)))

	// Abort by workflow: the same cancel as machines abort.
	hold := f.sim.HoldNext(metal.KindPowerCycle)
	in, err := f.admin.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	wf2 := in.Msg.GetMachine().GetWorkflowId()
	bctest.WaitFor(t, "the held power cycle to be dispatched", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM provision_steps WHERE workflow_id = $1 AND idx = 0 AND dispatched`, wf2) == 1
	})
	_, err = f.admin.Machines.AbortWorkflow(ctx, connect.NewRequest(&apiv1.AbortMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
	refused(t, err, "FAILED_PRECONDITION", "", "not machine m1's active workflow")
	a, err := f.admin.Machines.AbortWorkflow(ctx, connect.NewRequest(&apiv1.AbortMachineWorkflowRequest{Tenant: "acme", Workflow: wf2}))
	require.NoError(t, err)
	require.True(t, a.Msg.GetWorkflow().GetCancelRequested())
	require.Equal(t, "inspecting", a.Msg.GetMachine().GetState())
	hold()
	m = f.waitIdle(t, "m1")
	require.Equal(t, "failed", m.GetState())
	require.Equal(t, "the workflow was cancelled", m.GetFailureReason())
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE resource_id = $1 AND type = 'machine.abort_requested'`, m.GetId()))
	_, err = f.admin.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: wf2, FromStep: "boot-ramdisk"}))
	refused(t, err, "FAILED_PRECONDITION", "", "was cancelled")
}

// TestWorkflowRetryAfterAttestedWipe: a failed commission whose wipe
// succeeded is not retried past its ramdisk boot (the erase record's key
// went with the ramdisk); from the boot, it ends ready with a new record.
func TestWorkflowRetryAfterAttestedWipe(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	sm := f.sim.AddMachine(t, "m1")
	f.enroll(t, sm)
	f.sim.FailNext(metal.KindPowerOff, "bmc said no")
	c, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	wf := c.Msg.GetMachine().GetWorkflowId()
	f.failPowerOff(t, wf)
	require.Equal(t, "failed", f.waitIdle(t, "m1").GetState())

	_, err = f.admin.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: wf, FromStep: "power-off"}))
	refused(t, err, "INVALID_ARGUMENT", "from_step", "step inventory's signed record is checked with the key of the ramdisk that ran it")
	refused(t, err, "INVALID_ARGUMENT", "from_step", "retry from boot-ramdisk")
	_, err = f.admin.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: wf, FromStep: "boot-ramdisk"}))
	require.NoError(t, err)
	m := f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.Equal(t, 2, sm.Wipes())
	require.NotNil(t, m.GetEraseRecord())
}
