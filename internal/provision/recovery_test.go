package provision_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// dyingRunner kills its worker (cancels the context the engine runs in)
// during the first dispatch: before the request reaches the site, or after
// the site applied it but before the engine could record that.
type dyingRunner struct {
	*fakeSite
	after  bool
	kill   context.CancelFunc
	killed bool
}

func (r *dyingRunner) Dispatch(ctx context.Context, run provision.StepRun) (provision.Dispatched, error) {
	if r.killed {
		return r.fakeSite.Dispatch(ctx, run)
	}
	r.killed = true
	if r.after {
		_, _ = r.execute(run)
	}
	r.kill()
	<-ctx.Done()
	return provision.Dispatched{}, ctx.Err()
}

func wipeProfile() []provision.Profile {
	return []provision.Profile{{Name: "release", Steps: []provision.Step{
		{Name: "wipe", Kind: "disk.wipe", Destructive: true, Timeout: time.Hour},
		{Name: "inventory", Kind: "inventory.refresh"},
	}}}
}

func attemptStates(t *testing.T, f *fixture, id string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, f.db.Read(f.ctx, func(ctx context.Context, tx store.Tx) error {
		as, err := provision.Attempts(ctx, tx, id)
		for _, a := range as {
			out[a.IdempotencyKey] = a.State
		}
		return err
	}))
	return out
}

func TestWorkerDiesMidDispatch(t *testing.T) {
	t.Parallel()
	for _, after := range []bool{false, true} {
		name := "before the site got it"
		if after {
			name = "after the site applied it"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var dr *dyingRunner
			f := setup(t, wipeProfile(), func(c *provision.Config) {
				dr = &dyingRunner{fakeSite: c.Runners["disk.wipe"].(*fakeSite), after: after}
				c.Runners["disk.wipe"] = dr
			})
			w := f.start(t, "mch_1", "release")
			key1 := provision.IdempotencyKey(w.ID, 0, 1)
			ctx, cancel := context.WithCancel(f.ctx)
			dr.kill = cancel
			require.ErrorIs(t, f.eng.Reconcile(ctx, w.ID), context.Canceled)

			// The claim committed before the dispatch; the key is on the row.
			w = f.get(t, w.ID)
			s := w.Steps[0]
			require.Equal(t, provision.StepRunning, s.State)
			require.False(t, s.Dispatched)
			require.Equal(t, key1, s.IdempotencyKey)

			// While the claim's lease lasts, nobody touches it.
			w = f.reconcile(t, w.ID)
			require.Equal(t, 1, w.Steps[0].Attempt)
			n, err := f.eng.Sweep(f.ctx)
			require.NoError(t, err)
			require.Zero(t, n)

			f.clk.Advance(time.Minute)
			n, err = f.eng.Sweep(f.ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n, "the orphaned claim is due")
			w = f.reconcile(t, w.ID)
			s = w.Steps[0]
			if after {
				// Re-attached to the same key: nothing sent again.
				require.Equal(t, 1, s.Attempt)
				require.True(t, s.Dispatched)
				require.Equal(t, "cmd-"+key1, s.Handle)
				f.complete(t, "")
			} else {
				// The site fenced the key that never arrived; a new key went out.
				require.Equal(t, 2, s.Attempt)
				require.Equal(t, "fenced", attemptStates(t, f, w.ID)[key1])
				require.Zero(t, s.Failures, "a lost worker is not the step's failure")
				f.complete(t, "")
			}
			w = f.reconcile(t, w.ID)
			require.Equal(t, provision.WorkflowSucceeded, w.State)
			if after {
				require.Equal(t, 1, f.site.count(key1))
			} else {
				require.Equal(t, 0, f.site.count(key1))
				require.Equal(t, 1, f.site.count(provision.IdempotencyKey(w.ID, 0, 2)))
			}
			require.Equal(t, 1, f.site.perStep[w.ID+":0"], "the wipe ran once")
		})
	}
}

func TestUnknownOutcomeFailsDestructiveStep(t *testing.T) {
	t.Parallel()
	var dr *dyingRunner
	f := setup(t, wipeProfile(), func(c *provision.Config) {
		dr = &dyingRunner{fakeSite: c.Runners["disk.wipe"].(*fakeSite), after: true}
		c.Runners["disk.wipe"] = dr
	})
	f.site.lookupUnknown = true
	w := f.start(t, "mch_1", "release")
	ctx, cancel := context.WithCancel(f.ctx)
	dr.kill = cancel
	require.Error(t, f.eng.Reconcile(ctx, w.ID))

	f.clk.Advance(time.Minute)
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowFailed, w.State)
	require.Equal(t, "wipe", w.FailedStep)
	require.Contains(t, w.Reason, "unknown outcome")
	require.Contains(t, w.Reason, provision.IdempotencyKey(w.ID, 0, 1))
	require.Equal(t, []string{"wipe=failed", "inventory=skipped"}, stepStates(w))
	require.Equal(t, 1, f.site.dispatches(), "nothing was sent again")
	require.Equal(t, "unknown", attemptStates(t, f, w.ID)[provision.IdempotencyKey(w.ID, 0, 1)])

	// A late result is kept on the claim for the operator.
	require.NoError(t, f.eng.Complete(f.ctx, provision.IdempotencyKey(w.ID, 0, 1), provision.Result{}))
	require.Equal(t, "succeeded", attemptStates(t, f, w.ID)[provision.IdempotencyKey(w.ID, 0, 1)])
	require.Equal(t, provision.WorkflowFailed, f.get(t, w.ID).State)
}

func TestNonDestructiveStepRunsAgainAfterLostWorker(t *testing.T) {
	t.Parallel()
	var dr *dyingRunner
	profiles := []provision.Profile{{Name: "inspect", Steps: []provision.Step{{Name: "inventory", Kind: "inventory.refresh"}}}}
	f := setup(t, profiles, func(c *provision.Config) {
		dr = &dyingRunner{fakeSite: c.Runners["inventory.refresh"].(*fakeSite), after: true}
		c.Runners["inventory.refresh"] = dr
	})
	f.site.lookupUnknown = true
	w := f.start(t, "mch_1", "inspect")
	ctx, cancel := context.WithCancel(f.ctx)
	dr.kill = cancel
	require.Error(t, f.eng.Reconcile(ctx, w.ID))
	f.clk.Advance(time.Minute)
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowSucceeded, w.State)
	require.Equal(t, 2, w.Steps[0].Attempt)
	require.Equal(t, "abandoned", attemptStates(t, f, w.ID)[provision.IdempotencyKey(w.ID, 0, 1)])
}

// ambiguousRunner applies the dispatch at the site and then reports an
// error that does not say whether it happened (a connection reset).
type ambiguousRunner struct{ *fakeSite }

func (r ambiguousRunner) Dispatch(_ context.Context, run provision.StepRun) (provision.Dispatched, error) {
	_, _ = r.execute(run)
	return provision.Dispatched{}, errors.New("connection reset by peer")
}

func TestAmbiguousDispatchErrorAsksTheRunner(t *testing.T) {
	t.Parallel()
	f := setup(t, wipeProfile(), func(c *provision.Config) {
		c.Runners["disk.wipe"] = ambiguousRunner{c.Runners["disk.wipe"].(*fakeSite)}
	})
	w := f.start(t, "mch_1", "release")
	w = f.reconcile(t, w.ID)
	require.True(t, w.Steps[0].Dispatched, "re-attached after asking")
	require.Equal(t, 1, w.Steps[0].Attempt)
	f.complete(t, "")
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowSucceeded, w.State)
	require.Equal(t, 1, f.site.count(provision.IdempotencyKey(w.ID, 0, 1)))
}

func TestDeadlineOfDispatchedStep(t *testing.T) {
	t.Parallel()
	t.Run("lost completion is found by asking", func(t *testing.T) {
		t.Parallel()
		f := setup(t, wipeProfile(), nil)
		w := f.start(t, "mch_1", "release")
		f.reconcile(t, w.ID)
		// The site finished, but its report never arrived (the site agent died).
		_, ok := f.site.finish("")
		require.True(t, ok)
		f.clk.Advance(time.Hour)
		w = f.reconcile(t, w.ID)
		require.Equal(t, provision.WorkflowSucceeded, w.State)
		require.Equal(t, 1, f.site.count(provision.IdempotencyKey(w.ID, 0, 1)))
		require.Equal(t, 1, f.site.perStep[w.ID+":0"])
	})
	t.Run("still running is an unknown outcome", func(t *testing.T) {
		t.Parallel()
		f := setup(t, wipeProfile(), nil)
		w := f.start(t, "mch_1", "release")
		f.reconcile(t, w.ID)
		f.clk.Advance(time.Hour)
		w = f.reconcile(t, w.ID)
		require.Equal(t, provision.WorkflowFailed, w.State)
		require.Contains(t, w.Steps[0].Error, "unknown outcome: timed out after 1h0m0s and the runner still reports it running")
		require.Equal(t, 1, f.site.dispatches())
	})
}
