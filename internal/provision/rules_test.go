package provision_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

func TestCondLanguage(t *testing.T) {
	t.Parallel()
	env := map[string]any{
		"input":   map[string]any{"burn_in": true, "n": 3, "name": "x"},
		"machine": map[string]any{"bmc_driver": "redfish"},
		"output":  map[string]any{"disks": []any{"a", "b"}, "count": float64(2)},
	}
	for src, want := range map[string]bool{
		`input.burn_in == true`:                                true,
		`input.burn_in`:                                        true,
		`!input.burn_in`:                                       false,
		`machine.bmc_driver == "redfish"`:                      true,
		`machine.bmc_driver != "ipmi" && input.n >= 3`:         true,
		`input.n > 3 || input.name == "x"`:                     true,
		`len(output.disks) >= 1`:                               true,
		`output.count == 2`:                                    true,
		`output.missing > 0`:                                   false,
		`output.missing == null`:                               true,
		`(input.n < 1 || input.n > 2) && !(input.name == "y")`: true,
		`input.name < "y"`:                                     true,
		`input.burn_in == "true"`:                              false,
		`machine.bmc_driver.deeper == "x"`:                     false,
		`input.n >= -1`:                                        true,
	} {
		c, err := provision.ParseCond(src, provision.RootInput, provision.RootMachine, provision.RootOutput)
		require.NoError(t, err, src)
		require.Equal(t, want, c.Eval(env), src)
	}
	for src, want := range map[string]string{
		``:                       "is empty",
		`input.x ==`:             "ends early",
		`input.x = 1`:            "unexpected",
		`os.exec("rm")`:          "must start with one of",
		`input.x == "open`:       "unterminated",
		`len input.x`:            "must be called",
		`(input.x == 1`:          "missing )",
		`input.x == 1 input.y`:   "unexpected",
		`output.disks >= 1`:      "must start with one of input, machine",
		strings.Repeat("a", 600): "at most",
	} {
		_, err := provision.ParseCond(src, provision.RootInput, provision.RootMachine)
		require.ErrorContains(t, err, want, src)
	}
}

func TestProfileRuleValidation(t *testing.T) {
	t.Parallel()
	base := func() provision.Profile {
		return provision.Profile{Name: "p", Steps: []provision.Step{
			{Name: "a", Kind: "power.cycle"},
			{Name: "a-fallback", Kind: "power.cycle", FallbackFor: "a"},
			{Name: "b", Kind: "inventory.refresh", When: "input.x == 1", Acceptance: []string{"output.n > 0"}},
		}, Cleanup: []provision.Step{{Name: "off", Kind: "power.cycle"}}}
	}
	require.NoError(t, base().Validate())
	for name, tt := range map[string]struct {
		edit        func(p *provision.Profile)
		field, want string
	}{
		"when":             {func(p *provision.Profile) { p.Steps[2].When = "input.x ==" }, "steps[2].when", "ends early"},
		"when output":      {func(p *provision.Profile) { p.Steps[2].When = "output.x == 1" }, "steps[2].when", "must start with"},
		"acceptance":       {func(p *provision.Profile) { p.Steps[2].Acceptance = []string{"ok", "rm -rf"} }, "steps[2].acceptance[1]", "unexpected"},
		"fallback far":     {func(p *provision.Profile) { p.Steps[2].FallbackFor = "a" }, "steps[2].fallback_for", "just before"},
		"fallback chain":   {func(p *provision.Profile) { p.Steps[2].FallbackFor = "a-fallback" }, "steps[2].fallback_for", "itself a fallback"},
		"cleanup rule":     {func(p *provision.Profile) { p.Cleanup[0].OnFailure = "goto a" }, "cleanup[0].on_failure", "fail"},
		"cleanup kind":     {func(p *provision.Profile) { p.Cleanup[0].Kind = "" }, "cleanup[0].kind", "is required"},
		"cleanup fallback": {func(p *provision.Profile) { p.Cleanup[0].FallbackFor = "a" }, "cleanup[0].fallback_for", "no fallback"},
		"cleanup when":     {func(p *provision.Profile) { p.Cleanup[0].When = "((" }, "cleanup[0].when", ""},
	} {
		t.Run(name, func(t *testing.T) {
			p := base()
			tt.edit(&p)
			ee := requireCode(t, p.Validate(), envelope.CodeInvalidArgument)
			found := false
			for _, v := range ee.Violations {
				found = found || v.Field == tt.field && strings.Contains(v.Reason, tt.want)
			}
			require.True(t, found, "want %s: %s in %v", tt.field, tt.want, ee.Violations)
		})
	}
}

func TestWhenFallbackAcceptanceCleanup(t *testing.T) {
	t.Parallel()
	profiles := []provision.Profile{
		// when: burn-in only when asked, wipe only on a redfish machine.
		{Name: "cond", Steps: []provision.Step{
			{Name: "burn", Kind: "inventory.refresh", When: "input.burn_in == true"},
			{Name: "redfish-only", Kind: "power.cycle", When: `machine.bmc_driver == "redfish"`},
			{Name: "last", Kind: "power.cycle"},
		}},
		// fallback: runs when its step failed, is skipped when it did not.
		{Name: "fb", Steps: []provision.Step{
			{Name: "inv", Kind: "inventory.refresh"},
			{Name: "inv-fallback", Kind: "power.cycle", FallbackFor: "inv"},
			{Name: "power", Kind: "power.cycle"},
			{Name: "power-fallback", Kind: "power.cycle", FallbackFor: "power"},
		}},
		// acceptance: a success whose output fails a check is a failure,
		// and the cleanup runs.
		{Name: "acc", Steps: []provision.Step{
			{Name: "inv", Kind: "inventory.refresh", Acceptance: []string{`output.kind == "inventory.refresh"`}},
			{Name: "power", Kind: "power.cycle", Acceptance: []string{"len(output.disks) >= 1"}},
			{Name: "never", Kind: "power.cycle"},
		}, Cleanup: []provision.Step{{Name: "off", Kind: "power.cycle"}}},
	}
	f := setup(t, profiles, func(c *provision.Config) {
		c.Facts = func(_ context.Context, _ store.Querier, target string) (map[string]any, error) {
			return map[string]any{"bmc_driver": map[string]string{"m_redfish": "redfish"}[target]}, nil
		}
	})
	run := func(target, profile string, input map[string]any) provision.Workflow {
		w, err := f.eng.Start(f.ctx, provision.StartParams{TenantID: "tnt_test", TargetID: target, Profile: profile, Input: input})
		require.NoError(t, err)
		return f.reconcile(t, w.ID)
	}

	w := run("m_ipmi", "cond", map[string]any{"burn_in": false})
	require.Equal(t, provision.WorkflowSucceeded, w.State)
	require.Equal(t, []string{"burn=skipped", "redfish-only=skipped", "last=succeeded"}, stepStates(w))
	require.Equal(t, "when input.burn_in == true is false", w.Steps[0].Error)
	require.Contains(t, f.eventTypes(t, w.ID), "workflow.step_skipped")
	w = run("m_redfish", "cond", map[string]any{"burn_in": true})
	require.Equal(t, []string{"burn=succeeded", "redfish-only=succeeded", "last=succeeded"}, stepStates(w))

	f.site.fail["inventory.refresh"] = 1
	w = run("m_fb", "fb", nil)
	require.Equal(t, provision.WorkflowSucceeded, w.State, w.Reason)
	require.Equal(t, []string{"inv=failed", "inv-fallback=succeeded", "power=succeeded", "power-fallback=skipped"}, stepStates(w))
	require.Equal(t, "fallback for power, which did not fail", w.Steps[3].Error)

	w = run("m_acc", "acc", nil)
	require.Equal(t, provision.WorkflowFailed, w.State)
	require.Equal(t, "power", w.FailedStep)
	require.Contains(t, w.Reason, "acceptance len(output.disks) >= 1 is false")
	require.Equal(t, []string{"inv=succeeded", "power=failed", "never=skipped", "off=succeeded"}, stepStates(w))
	require.Equal(t, provision.PhaseCleanup, w.Steps[3].Phase)
}

// TestSkippedAwaitTakesNoSignal: an await step whose when is false is
// skipped, not claimed by an early signal.
func TestSkippedAwaitTakesNoSignal(t *testing.T) {
	t.Parallel()
	f := setup(t, []provision.Profile{{Name: "p", Steps: []provision.Step{
		{Name: "wait", Kind: provision.KindAwaitRejoin, When: "input.wait == true"},
		{Name: "power", Kind: "power.cycle"},
	}}}, nil)
	w, err := f.eng.Start(f.ctx, provision.StartParams{TenantID: "tnt_test", TargetID: "m1", Profile: "p", Input: map[string]any{"wait": false}})
	require.NoError(t, err)
	_, err = f.eng.Signal(f.ctx, "m1", provision.KindAwaitRejoin, provision.Result{})
	requireCode(t, err, envelope.CodeFailedPrecondition)
	w = f.reconcile(t, w.ID)
	require.Equal(t, provision.WorkflowSucceeded, w.State)
	require.Equal(t, []string{"wait=skipped", "power=succeeded"}, stepStates(w))
}
