package provision_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// deployProfiles is a deploy with every kind of step and a cleanup.
func deployProfiles() []provision.Profile {
	return []provision.Profile{
		{Name: "deploy", Steps: []provision.Step{
			{Name: "power", Kind: "power.cycle", Destructive: true, Timeout: time.Minute},
			{Name: "rejoin", Kind: provision.KindAwaitRejoin, Timeout: 10 * time.Minute},
			{Name: "write", Kind: "image.write", Destructive: true, Timeout: 20 * time.Minute, Params: map[string]any{"verify": true}},
			{Name: "inventory", Kind: "inventory.refresh", Timeout: time.Minute},
		}},
		{Name: "cleanup", Steps: []provision.Step{
			{Name: "wipe", Kind: "disk.wipe", Destructive: true, Timeout: time.Hour},
		}},
	}
}

func TestWorkflowRunsToSuccess(t *testing.T) {
	t.Parallel()
	f := setup(t, deployProfiles(), nil)
	w := f.start(t, "mch_1", "deploy")
	require.Equal(t, provision.WorkflowPending, w.State)

	// power.cycle runs synchronously; the workflow then waits for the rejoin.
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowRunning, w.State)
	require.Equal(t, []string{"power=succeeded", "rejoin=awaiting", "write=pending", "inventory=pending"}, stepStates(w))
	require.Equal(t, 1, f.site.count(provision.IdempotencyKey(w.ID, 0, 1)))
	require.Equal(t, "cmd-"+provision.IdempotencyKey(w.ID, 0, 1), w.Steps[0].Handle)

	_, err := f.eng.Signal(f.ctx, "mch_1", provision.KindAwaitRejoin, provision.Result{Output: map[string]any{"node": "n1"}})
	require.NoError(t, err)
	// image.write is dispatched and runs at the site until Complete.
	w = f.reconcile(t, w.ID)
	require.Equal(t, []string{"power=succeeded", "rejoin=succeeded", "write=running", "inventory=pending"}, stepStates(w))
	require.True(t, w.Steps[2].Dispatched)
	require.Equal(t, map[string]any{"node": "n1"}, w.Steps[1].Output)

	key := f.complete(t, "")
	require.Equal(t, provision.IdempotencyKey(w.ID, 2, 1), key)
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowSucceeded, w.State)
	require.Equal(t, []string{"power=succeeded", "rejoin=succeeded", "write=succeeded", "inventory=succeeded"}, stepStates(w))
	require.NotNil(t, w.EndTime)
	require.Equal(t, map[string]any{"bytes": float64(42)}, w.Steps[2].Output)

	require.Equal(t, []string{
		"workflow.created", "workflow.started",
		"workflow.step_started", "workflow.step_succeeded", // power
		"workflow.step_started", "workflow.step_succeeded", // rejoin
		"workflow.step_started", "workflow.step_succeeded", // write
		"workflow.step_started", "workflow.step_succeeded", // inventory
		"workflow.succeeded",
	}, f.eventTypes(t, w.ID))

	// Running it again changes nothing: level-triggered.
	require.NoError(t, f.eng.Reconcile(f.ctx, w.ID))
	require.Equal(t, 3, f.site.dispatches())

	var attempts []provision.Attempt
	require.NoError(t, f.db.Read(f.ctx, func(ctx context.Context, tx store.Tx) (err error) {
		attempts, err = provision.Attempts(ctx, tx, w.ID)
		return err
	}))
	require.Len(t, attempts, 4)
	for _, a := range attempts {
		require.Equal(t, "succeeded", a.State, a.IdempotencyKey)
	}
}

func TestSecondWorkflowOnBusyTargetFails(t *testing.T) {
	t.Parallel()
	f := setup(t, deployProfiles(), nil)
	w := f.start(t, "mch_1", "deploy")
	before := len(f.eventTypes(t, w.ID))

	_, err := f.eng.Start(f.ctx, provision.StartParams{TenantID: "tnt_test", TargetID: "mch_1", Profile: "cleanup"})
	ee := requireCode(t, err, envelope.CodeFailedPrecondition)
	require.True(t, errors.Is(err, provision.ErrTargetBusy))
	require.Contains(t, ee.Message, "target mch_1 already has an active workflow: "+w.ID)

	// Nothing was written: one workflow, no new events.
	var ws []provision.Workflow
	require.NoError(t, f.db.Read(f.ctx, func(ctx context.Context, tx store.Tx) (err error) {
		ws, err = provision.List(ctx, tx, provision.ListParams{TargetID: "mch_1"})
		return err
	}))
	require.Len(t, ws, 1)
	require.Len(t, f.eventTypes(t, w.ID), before)

	// Another target is free; once the first ends, the target is free too.
	f.start(t, "mch_2", "cleanup")
	_, err = f.eng.Cancel(f.ctx, w.ID)
	require.NoError(t, err)
	require.Equal(t, provision.WorkflowCancelled, f.get(t, w.ID).State)
	f.start(t, "mch_1", "cleanup")
}

// The database, not only the code, holds the invariants.
func TestDatabaseHoldsInvariants(t *testing.T) {
	t.Parallel()
	f := setup(t, deployProfiles(), nil)
	w := f.start(t, "mch_1", "deploy")
	w = f.reconcile(t, w.ID) // rejoin awaiting

	exec := func(q string, args ...any) error {
		return f.db.Write(f.ctx, func(ctx context.Context, tx store.Tx) error {
			_, err := tx.Exec(ctx, q, args...)
			return err
		})
	}
	// A second active workflow on the target.
	err := exec(`INSERT INTO provision_workflows (id, tenant_id, target_id, profile, spec, state, create_time, update_time)
		VALUES ('wf_other', 'tnt_test', 'mch_1', 'deploy', '{}', 'running', $1, $1)`, f.clk.Now())
	require.ErrorIs(t, err, store.ErrUnique)
	// A second step in flight.
	err = exec(`UPDATE provision_steps SET state = 'running', idempotency_key = 'k' WHERE id = $1`, w.Steps[2].ID)
	require.ErrorIs(t, err, store.ErrUnique)
	// A step in flight without its key.
	err = exec(`UPDATE provision_steps SET idempotency_key = '' WHERE id = $1`, w.Steps[1].ID)
	require.ErrorIs(t, err, store.ErrConstraint)
	// A key claimed twice.
	err = exec(`INSERT INTO provision_attempts (idempotency_key, step_id, workflow_id, attempt, destructive, state, claim_time)
		VALUES ($1, $2, $3, 9, false, 'claimed', $4)`, w.Steps[1].IdempotencyKey, w.Steps[1].ID, w.ID, f.clk.Now())
	require.ErrorIs(t, err, store.ErrUnique)
}

func TestStartRefusesBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t, deployProfiles(), nil)
	_, err := f.eng.Start(f.ctx, provision.StartParams{Profile: "nope", Input: map[string]any{"f": func() {}}})
	ee := requireCode(t, err, envelope.CodeInvalidArgument)
	var fields []string
	for _, v := range ee.Violations {
		fields = append(fields, v.Field)
	}
	require.Equal(t, []string{"tenant_id", "target_id", "profile", "input"}, fields)
	require.Contains(t, ee.Violations[2].Reason, `names no profile: "nope" (known: [cleanup deploy])`)
	var ws []provision.Workflow
	require.NoError(t, f.db.Read(f.ctx, func(ctx context.Context, tx store.Tx) (err error) {
		ws, err = provision.List(ctx, tx, provision.ListParams{})
		return err
	}))
	require.Empty(t, ws)
}

func TestRetriesWithExponentialBackoff(t *testing.T) {
	t.Parallel()
	profiles := []provision.Profile{{Name: "inspect", Steps: []provision.Step{
		{Name: "inventory", Kind: "inventory.refresh", Retries: 3, Backoff: 10 * time.Second},
	}}}
	f := setup(t, profiles, nil)
	f.site.fail["inventory.refresh"] = 2
	w := f.start(t, "mch_1", "inspect")
	t0 := f.clk.Now()

	w = f.reconcile(t, w.ID)
	s := w.Steps[0]
	require.Equal(t, provision.StepPending, s.State)
	require.Equal(t, 1, s.Failures)
	require.Equal(t, "inventory.refresh failed", s.Error)
	require.Equal(t, t0.Add(10*time.Second), *s.NotBefore)

	// Not before the backoff ends.
	f.clk.Advance(9 * time.Second)
	w = f.reconcile(t, w.ID)
	require.Equal(t, 1, w.Steps[0].Attempt)

	f.clk.Advance(time.Second)
	w = f.reconcile(t, w.ID)
	s = w.Steps[0]
	require.Equal(t, 2, s.Failures)
	require.Equal(t, f.clk.Now().Add(20*time.Second), *s.NotBefore, "the backoff doubles")

	f.clk.Advance(20 * time.Second)
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowSucceeded, w.State)
	require.Equal(t, 3, w.Steps[0].Attempt)
	for a := 1; a <= 3; a++ {
		require.Equal(t, 1, f.site.count(provision.IdempotencyKey(w.ID, 0, a)), "each attempt has its own key, sent once")
	}
	require.Contains(t, f.eventTypes(t, w.ID), "workflow.step_retrying")
}

func TestOnFailure(t *testing.T) {
	t.Parallel()
	profiles := []provision.Profile{
		{Name: "cont", Steps: []provision.Step{
			{Name: "inv", Kind: "inventory.refresh", OnFailure: "continue"},
			{Name: "power", Kind: "power.cycle", Destructive: true},
		}},
		{Name: "jump", Steps: []provision.Step{
			{Name: "inv", Kind: "inventory.refresh", OnFailure: "goto power"},
			{Name: "skipped", Kind: "image.write", Destructive: true},
			{Name: "power", Kind: "power.cycle", Destructive: true},
		}},
		{Name: "clean", Steps: []provision.Step{
			{Name: "power", Kind: "power.cycle", Destructive: true},
			{Name: "inv", Kind: "inventory.refresh", OnFailure: "run profile scrub"},
			{Name: "never", Kind: "image.write", Destructive: true},
		}},
		{Name: "scrub", Steps: []provision.Step{
			{Name: "power", Kind: "power.cycle", Destructive: true},
		}},
		{Name: "stop", Steps: []provision.Step{
			{Name: "inv", Kind: "inventory.refresh"},
			{Name: "power", Kind: "power.cycle", Destructive: true},
		}},
	}
	tests := []struct {
		profile string
		state   provision.WorkflowState
		steps   []string
	}{
		{"cont", provision.WorkflowSucceeded, []string{"inv=failed", "power=succeeded"}},
		{"jump", provision.WorkflowSucceeded, []string{"inv=failed", "skipped=skipped", "power=succeeded"}},
		{"clean", provision.WorkflowFailed, []string{"power=succeeded", "inv=failed", "never=skipped", "power=succeeded"}},
		{"stop", provision.WorkflowFailed, []string{"inv=failed", "power=skipped"}},
	}
	for _, tt := range tests {
		t.Run(tt.profile, func(t *testing.T) {
			t.Parallel()
			f := setup(t, profiles, nil)
			f.site.fail["inventory.refresh"] = 1
			w := f.start(t, "mch_1", tt.profile)
			w = f.reconcile(t, w.ID)
			require.Equal(t, tt.state, w.State)
			require.Equal(t, tt.steps, stepStates(w))
			if tt.state == provision.WorkflowFailed {
				require.Equal(t, "inv", w.FailedStep)
				require.Contains(t, w.Reason, "step inv failed: inventory.refresh failed")
			}
			if tt.profile == "clean" {
				require.Equal(t, provision.PhaseCleanup, w.Steps[3].Phase)
				require.Contains(t, f.eventTypes(t, w.ID), "workflow.cleanup_started")
			}
		})
	}
}

func TestAwaitTimesOut(t *testing.T) {
	t.Parallel()
	f := setup(t, deployProfiles(), nil)
	w := f.start(t, "mch_1", "deploy")
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.StepAwaiting, w.Steps[1].State)

	f.clk.Advance(10*time.Minute - time.Second)
	n, err := f.eng.Sweep(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is due before the deadline")
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.StepAwaiting, w.Steps[1].State)

	f.clk.Advance(time.Second)
	n, err = f.eng.Sweep(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowFailed, w.State)
	require.Equal(t, "rejoin", w.FailedStep)
	require.Contains(t, w.Steps[1].Error, "timed out after 10m0s waiting for await.rejoin")

	// A late signal finds nothing to wake.
	_, err = f.eng.Signal(f.ctx, "mch_1", provision.KindAwaitRejoin, provision.Result{})
	requireCode(t, err, envelope.CodeFailedPrecondition)
}

func TestSignalBeforeAwaitIsTaken(t *testing.T) {
	t.Parallel()
	profiles := []provision.Profile{{Name: "boot", Steps: []provision.Step{
		{Name: "wipe", Kind: "disk.wipe", Destructive: true},
		{Name: "rejoin", Kind: provision.KindAwaitRejoin},
	}}}
	f := setup(t, profiles, nil)
	w := f.start(t, "mch_1", "boot")
	w = f.reconcile(t, w.ID)
	// The wrong kind, and a signal while another step is in flight, are refused.
	_, err := f.eng.Signal(f.ctx, "mch_1", "await.os", provision.Result{})
	requireCode(t, err, envelope.CodeFailedPrecondition)
	_, err = f.eng.Signal(f.ctx, "mch_1", provision.KindAwaitRejoin, provision.Result{})
	requireCode(t, err, envelope.CodeFailedPrecondition)
	_, err = f.eng.Signal(f.ctx, "mch_1", "disk.wipe", provision.Result{})
	requireCode(t, err, envelope.CodeInvalidArgument)

	f.complete(t, "")
	// The ramdisk joined before the advance job reached the await step.
	w, err = f.eng.Signal(f.ctx, "mch_1", provision.KindAwaitRejoin, provision.Result{})
	require.NoError(t, err)
	require.Equal(t, provision.WorkflowSucceeded, w.State)
}

// TestSignalProvingTheStepInFlight: a signal that proves the running step
// before its await step (a ramdisk that joined before the site's report of
// the boot) ends that step and is taken by the await step; a step of
// another kind is never ended by it, and the site's report, when it comes,
// is a late one that changes nothing.
func TestSignalProvingTheStepInFlight(t *testing.T) {
	t.Parallel()
	profiles := []provision.Profile{{Name: "boot", Steps: []provision.Step{
		{Name: "boot", Kind: "disk.wipe", Destructive: true},
		{Name: "rejoin", Kind: provision.KindAwaitRejoin},
	}}}
	f := setup(t, profiles, nil)
	w := f.start(t, "mch_1", "boot")
	w = f.reconcile(t, w.ID)
	signal := func(proves string) (provision.Workflow, error) {
		var out provision.Workflow
		err := f.db.Write(f.ctx, func(ctx context.Context, tx store.Tx) (err error) {
			out, err = f.eng.SignalProvingTx(ctx, tx, "mch_1", provision.KindAwaitRejoin, proves, provision.Result{Output: map[string]any{"node": "n1"}})
			return err
		})
		return out, err
	}
	_, err := signal("image.write")
	requireCode(t, err, envelope.CodeFailedPrecondition)
	require.Equal(t, []string{"boot=running", "rejoin=pending"}, stepStates(f.get(t, w.ID)))

	w, err = signal("disk.wipe")
	require.NoError(t, err)
	require.Equal(t, provision.WorkflowSucceeded, w.State)
	require.Equal(t, []string{"boot=succeeded", "rejoin=succeeded"}, stepStates(w))
	require.Equal(t, map[string]any{"proven_by": provision.KindAwaitRejoin}, w.Steps[0].Output)
	require.Equal(t, map[string]any{"node": "n1"}, w.Steps[1].Output)

	f.complete(t, "")
	require.Equal(t, []string{"boot=succeeded", "rejoin=succeeded"}, stepStates(f.get(t, w.ID)), "the late report changes nothing")
}

func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	f := setup(t, deployProfiles(), nil)
	w := f.start(t, "mch_1", "deploy")
	w = f.reconcile(t, w.ID)
	w, err := f.eng.Pause(f.ctx, w.ID)
	require.NoError(t, err)
	require.Equal(t, provision.WorkflowPaused, w.State)

	// The step in flight still ends; the next one does not start.
	_, err = f.eng.Signal(f.ctx, "mch_1", provision.KindAwaitRejoin, provision.Result{})
	require.NoError(t, err)
	w = f.reconcile(t, w.ID)
	require.Equal(t, []string{"power=succeeded", "rejoin=succeeded", "write=pending", "inventory=pending"}, stepStates(w))
	n, err := f.eng.Sweep(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a paused workflow with nothing in flight is not due")

	_, err = f.eng.Resume(f.ctx, w.ID)
	require.NoError(t, err)
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.StepRunning, w.Steps[2].State)
	_, err = f.eng.Resume(f.ctx, w.ID)
	requireCode(t, err, envelope.CodeFailedPrecondition)

	_, err = f.eng.Pause(f.ctx, "wf_missing")
	requireCode(t, err, envelope.CodeNotFound)
}

func TestCancel(t *testing.T) {
	t.Parallel()
	f := setup(t, deployProfiles(), nil)

	// Awaiting: cancelled at once.
	w := f.start(t, "mch_1", "deploy")
	f.reconcile(t, w.ID)
	w, err := f.eng.Cancel(f.ctx, w.ID)
	require.NoError(t, err)
	require.Equal(t, provision.WorkflowCancelled, w.State)
	w = f.get(t, w.ID)
	require.Equal(t, []string{"power=succeeded", "rejoin=failed", "write=skipped", "inventory=skipped"}, stepStates(w))
	_, err = f.eng.Cancel(f.ctx, w.ID)
	requireCode(t, err, envelope.CodeFailedPrecondition)

	// A dispatched destructive step: the workflow holds the target until
	// the step ends, then is cancelled without starting another.
	w = f.start(t, "mch_2", "deploy")
	f.reconcile(t, w.ID)
	_, err = f.eng.Signal(f.ctx, "mch_2", provision.KindAwaitRejoin, provision.Result{})
	require.NoError(t, err)
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.StepRunning, w.Steps[2].State)
	w, err = f.eng.Cancel(f.ctx, w.ID)
	require.NoError(t, err)
	require.Equal(t, provision.WorkflowRunning, w.State)
	require.True(t, w.CancelRequested)
	_, err = f.eng.Start(f.ctx, provision.StartParams{TenantID: "tnt_test", TargetID: "mch_2", Profile: "cleanup"})
	requireCode(t, err, envelope.CodeFailedPrecondition)

	f.complete(t, "")
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowCancelled, w.State)
	require.Equal(t, []string{"power=succeeded", "rejoin=succeeded", "write=succeeded", "inventory=skipped"}, stepStates(w))
	require.Contains(t, f.eventTypes(t, w.ID), "workflow.cancelled")
}

func TestOnEndRunsInTheEndingTransaction(t *testing.T) {
	t.Parallel()
	var ended []provision.Workflow
	f := setup(t, deployProfiles(), func(c *provision.Config) {
		c.OnEnd = func(_ context.Context, tx store.Tx, w provision.Workflow) error {
			tx.AfterCommit(func() { ended = append(ended, w) })
			return nil
		}
	})
	w := f.start(t, "mch_1", "deploy")
	f.reconcile(t, w.ID)
	_, err := f.eng.Cancel(f.ctx, w.ID)
	require.NoError(t, err)
	require.Len(t, ended, 1)
	require.Equal(t, provision.WorkflowCancelled, ended[0].State)
}

func TestCompleteUnknownKey(t *testing.T) {
	t.Parallel()
	f := setup(t, deployProfiles(), nil)
	err := f.eng.Complete(f.ctx, "wf_x:0:1", provision.Result{})
	requireCode(t, err, envelope.CodeNotFound)
}

// Concurrent starts on one target: one wins; on PostgreSQL the losers that
// passed the check meet the index, and are refused the same way.
func TestConcurrentStartsOnOneTarget(t *testing.T) {
	t.Parallel()
	f := setup(t, deployProfiles(), nil)
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := f.eng.Start(f.ctx, provision.StartParams{TenantID: "tnt_test", TargetID: "mch_1", Profile: "deploy"})
			errs <- err
		}()
	}
	won := 0
	for range n {
		err := <-errs
		if err == nil {
			won++
			continue
		}
		requireCode(t, err, envelope.CodeFailedPrecondition)
		require.ErrorIs(t, err, provision.ErrTargetBusy)
	}
	require.Equal(t, 1, won)
	var ws []provision.Workflow
	require.NoError(t, f.db.Read(f.ctx, func(ctx context.Context, tx store.Tx) (err error) {
		ws, err = provision.List(ctx, tx, provision.ListParams{TargetID: "mch_1"})
		return err
	}))
	require.Len(t, ws, 1)
}

// TestPausedStepDeadline: a paused workflow's deadline fails nothing, and
// a resume gives the step in flight back the time the pause took.
func TestPausedStepDeadline(t *testing.T) {
	t.Parallel()
	f := setup(t, deployProfiles(), nil)
	w := f.start(t, "mch_1", "deploy")
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.StepAwaiting, w.Steps[1].State)
	_, err := f.eng.Pause(f.ctx, w.ID)
	require.NoError(t, err)

	f.clk.Advance(11 * time.Minute) // past rejoin's 10 minutes
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.StepAwaiting, w.Steps[1].State)
	n, err := f.eng.Sweep(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a paused workflow's deadline is not due")

	_, err = f.eng.Resume(f.ctx, w.ID)
	require.NoError(t, err)
	f.clk.Advance(9 * time.Minute) // 20 minutes in, 9 of them running
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.StepAwaiting, w.Steps[1].State)
	f.clk.Advance(2 * time.Minute)
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowFailed, w.State)
	require.Contains(t, w.Steps[1].Error, "timed out")
}

// TestRetryFromStep: a failed workflow restarts at its failed step under
// new keys, the steps before not run again; bad retries are refused and
// write nothing.
func TestRetryFromStep(t *testing.T) {
	t.Parallel()
	f := setup(t, deployProfiles(), nil)
	w := f.start(t, "mch_1", "deploy")
	f.reconcile(t, w.ID)
	_, err := f.eng.Signal(f.ctx, "mch_1", provision.KindAwaitRejoin, provision.Result{})
	require.NoError(t, err)
	f.reconcile(t, w.ID)
	f.complete(t, "disk on fire")
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowFailed, w.State)
	require.Equal(t, "write", w.FailedStep)

	_, err = f.eng.Retry(f.ctx, w.ID, "nope")
	ee := requireCode(t, err, envelope.CodeInvalidArgument)
	require.Equal(t, "from_step", ee.Violations[0].Field)
	require.Contains(t, ee.Violations[0].Reason, `names no step of profile deploy: "nope" (steps: [power rejoin write inventory])`)
	_, err = f.eng.Retry(f.ctx, w.ID, "inventory")
	ee = requireCode(t, err, envelope.CodeInvalidArgument)
	require.Contains(t, ee.Violations[0].Reason, "comes after the failed step write")
	// Another workflow holds the target: the failed one cannot come back.
	other := f.start(t, "mch_1", "deploy")
	_, err = f.eng.Retry(f.ctx, w.ID, "write")
	requireCode(t, err, envelope.CodeFailedPrecondition)
	_, err = f.eng.Cancel(f.ctx, other.ID)
	require.NoError(t, err)
	require.Equal(t, provision.WorkflowFailed, f.get(t, w.ID).State)
	require.Zero(t, f.get(t, w.ID).Restarts)

	w, err = f.eng.Retry(f.ctx, w.ID, "write")
	require.NoError(t, err)
	require.Equal(t, provision.WorkflowRunning, w.State)
	require.Empty(t, w.FailedStep)
	require.Nil(t, w.EndTime)
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.StepRunning, w.Steps[2].State)
	require.Equal(t, provision.IdempotencyKey(w.ID, 2, 2), w.Steps[2].IdempotencyKey)
	require.Zero(t, w.Steps[2].Failures)
	f.complete(t, "")
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowSucceeded, w.State)
	require.Equal(t, 1, w.Restarts)
	require.Equal(t, 1, f.site.count(provision.IdempotencyKey(w.ID, 0, 1)))
	require.Zero(t, f.site.count(provision.IdempotencyKey(w.ID, 0, 2)), "the power step did not run again")
	require.Equal(t, 1, f.site.count(provision.IdempotencyKey(w.ID, 2, 1)))
	require.Equal(t, 1, f.site.count(provision.IdempotencyKey(w.ID, 2, 2)))
	require.Contains(t, f.eventTypes(t, w.ID), "workflow.retried")

	_, err = f.eng.Retry(f.ctx, w.ID, "power")
	requireCode(t, err, envelope.CodeFailedPrecondition)
}
