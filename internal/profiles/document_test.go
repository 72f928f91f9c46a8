package profiles_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/profiles"
	"github.com/better-compute/better-compute/internal/provision"
)

var testCatalog = profiles.Catalog{
	Kinds:     []string{"await.rejoin", "disk.wipe", "driver.invoke", "image.write", "inventory.refresh", "power.cycle", "power.off"},
	DriverOps: []string{"power.cycle", "power.off", "power.on"},
	Profiles:  []string{"release"},
}

const goodDoc = `apiVersion: bettercompute.io/v1
kind: DeployProfile
metadata:
  name: gpu-deploy
  description: Deploy with an optional burn-in.
spec:
  steps:
    - name: boot-ramdisk
      kind: power.cycle
      destructive: true
      params: {boot: ramdisk}
      timeout: 5m
      retries: 2
      backoff: 10s
      fallback:
        name: hard-cycle
        driver.invoke: {operation: power.cycle}
    - name: joined
      kind: await.rejoin
      timeout: 20m
    - name: inventory
      kind: inventory.refresh
      acceptance: ["len(output.disks) >= 1"]
    - name: burn-in
      kind: inventory.refresh
      when: input.burn_in == true
      on_failure: continue
    - name: off
      driver.invoke:
        operation: power.off
  cleanup:
    - name: power-off
      kind: power.off
      destructive: true
`

func TestParseExpands(t *testing.T) {
	t.Parallel()
	d, err := profiles.Parse([]byte(goodDoc), profiles.FormatYAML, testCatalog)
	require.NoError(t, err)
	require.Equal(t, "gpu-deploy", d.Name)
	require.Equal(t, profiles.KindDeploy, d.Kind)
	var names []string
	for _, s := range d.Profile.Steps {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"boot-ramdisk", "hard-cycle", "joined", "inventory", "burn-in", "off"}, names)
	fb := d.Profile.Steps[1]
	require.Equal(t, "boot-ramdisk", fb.FallbackFor)
	require.Equal(t, profiles.KindDriverInvoke, fb.Kind)
	require.True(t, fb.Destructive)
	require.Equal(t, map[string]any{"operation": "power.cycle"}, fb.Params)
	require.Equal(t, "input.burn_in == true", d.Profile.Steps[4].When)
	require.Equal(t, []string{"len(output.disks) >= 1"}, d.Profile.Steps[3].Acceptance)
	require.Len(t, d.Profile.Cleanup, 1)
	require.NoError(t, d.Profile.Validate())

	// A cleanup profile the engine has may be run.
	_, err = profiles.Parse([]byte(strings.Replace(goodDoc, "on_failure: continue", "on_failure: run release", 1)), "", testCatalog)
	require.NoError(t, err)

	// The same document as JSON.
	j := `{"apiVersion":"bettercompute.io/v1","kind":"DeployProfile","metadata":{"name":"j"},
		"spec":{"steps":[{"name":"a","kind":"power.cycle","retries":1,"timeout":"1m"}]}}`
	d, err = profiles.Parse([]byte(j), profiles.FormatJSON, testCatalog)
	require.NoError(t, err)
	require.Equal(t, 1, d.Profile.Steps[0].Retries)
}

func TestParseRefusesBadDocuments(t *testing.T) {
	t.Parallel()
	edit := func(old, new string) string {
		require.Contains(t, goodDoc, old)
		return strings.Replace(goodDoc, old, new, 1)
	}
	tests := []struct {
		name, doc, format, field, want string
	}{
		{"empty", "", "yaml", "document", "is required"},
		{"not yaml", "a: [", "yaml", "document", "not YAML"},
		{"not json", "{", "json", "document", "not JSON"},
		{"format", goodDoc, "toml", "format", "yaml or json"},
		{"apiVersion", edit("bettercompute.io/v1", "v2"), "", "apiVersion", "must be bettercompute.io/v1"},
		{"kind", edit("kind: DeployProfile", "kind: Pod"), "", "kind", "DeployProfile or HardwareProfile"},
		{"name", edit("name: gpu-deploy", "name: GPU Deploy"), "", "metadata.name", "must match"},
		{"unknown field", edit("  cleanup:", "  extra: 1\n  cleanup:"), "", "spec.extra", "not a field here"},
		{"step unknown field", edit("      timeout: 20m", "      timout: 20m"), "", "spec.steps[1].timout", "not a field here"},
		{"no steps", "apiVersion: bettercompute.io/v1\nkind: DeployProfile\nmetadata: {name: x}\nspec: {}\n", "", "spec.steps", "at least one step"},
		{"kind unregistered", edit("kind: await.rejoin", "kind: bios.flash"), "", "spec.steps[1].kind", "registered step kind"},
		{"kind and invoke", edit("      driver.invoke:\n        operation: power.off", "      kind: power.off\n      driver.invoke:\n        operation: power.off"), "", "spec.steps[4].driver.invoke", "not both"},
		{"driver op", edit("operation: power.off", "operation: bios.flash"), "", "spec.steps[4].driver.invoke.operation", "operation drivers carry out"},
		{"timeout", edit("timeout: 5m", "timeout: soon"), "", "spec.steps[0].timeout", "duration"},
		{"timeout range", edit("timeout: 5m", "timeout: 48h"), "", "spec.steps[0].timeout", "between 0"},
		{"retries", edit("retries: 2", "retries: two"), "", "spec.steps[0].retries", "whole number"},
		{"destructive", edit("destructive: true\n      params", "destructive: yes please\n      params"), "", "spec.steps[0].destructive", "true or false"},
		{"when", edit("when: input.burn_in == true", "when: input.burn_in ="), "", "spec.steps[3].when", "unexpected"},
		{"when root", edit("when: input.burn_in == true", "when: os.getenv == 1"), "", "spec.steps[3].when", "must start with"},
		{"acceptance", edit(`acceptance: ["len(output.disks) >= 1"]`, `acceptance: ["output.disks >="]`), "", "spec.steps[2].acceptance[0]", "ends early"},
		{"on_failure", edit("on_failure: continue", "on_failure: explode"), "", "spec.steps[3].on_failure", "goto <step>"},
		{"run unknown", edit("on_failure: continue", "on_failure: run scrub"), "", "spec.steps[3].on_failure", "run names no profile"},
		{"goto back", edit("on_failure: continue", "on_failure: goto joined"), "", "spec.steps[3].on_failure", "later step"},
		{"fallback kind", edit("driver.invoke: {operation: power.cycle}", "kind: nope.nope"), "", "spec.steps[0].fallback.kind", "registered step kind"},
		{"fallback of fallback", edit("driver.invoke: {operation: power.cycle}", "kind: power.cycle\n        fallback: {name: x, kind: power.cycle}"), "", "spec.steps[0].fallback.fallback", "not a field here"},
		{"fallback name clash", edit("name: hard-cycle", "name: joined"), "", "spec.steps[1].name", "already the name of spec.steps[0].fallback"},
		{"cleanup rule", edit("    - name: power-off\n      kind: power.off", "    - name: power-off\n      on_failure: goto off\n      kind: power.off"), "", "spec.cleanup[0].on_failure", "fail"},
		{"cleanup kind", edit("    - name: power-off\n      kind: power.off", "    - name: power-off\n      kind: x.y"), "", "spec.cleanup[0].kind", "registered step kind"},
		{"hardware driver", "apiVersion: bettercompute.io/v1\nkind: HardwareProfile\nmetadata: {name: h}\nspec: {driver: 'Red Fish'}\n", "", "spec.driver", "driver name"},
		{"hardware steps", "apiVersion: bettercompute.io/v1\nkind: HardwareProfile\nmetadata: {name: h}\nspec:\n  steps: [{name: a, kind: power.cycle}]\n", "", "spec.steps", "not a field here"},
		{"deploy driver", edit("  cleanup:", "  driver: redfish\n  cleanup:"), "", "spec.driver", "not a field here"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := profiles.Parse([]byte(tt.doc), tt.format, testCatalog)
			var ee *envelope.Error
			require.True(t, errors.As(err, &ee), "got %v", err)
			require.Equal(t, envelope.CodeInvalidArgument, ee.Code)
			found := false
			for _, v := range ee.Violations {
				found = found || v.Field == tt.field && strings.Contains(v.Reason, tt.want)
			}
			require.True(t, found, "want %s: %q in %+v", tt.field, tt.want, ee.Violations)
		})
	}
}

func TestHardwareProfile(t *testing.T) {
	t.Parallel()
	d, err := profiles.Parse([]byte("apiVersion: bettercompute.io/v1\nkind: HardwareProfile\nmetadata: {name: dgx-h100}\nspec: {driver: redfish}\n"), "", testCatalog)
	require.NoError(t, err)
	require.Equal(t, "redfish", d.Driver)
	require.Empty(t, d.Profile.Steps)
}

func TestBuiltinsParse(t *testing.T) {
	t.Parallel()
	ds, err := profiles.Builtins()
	require.NoError(t, err)
	require.NotEmpty(t, ds)
	for _, d := range ds {
		require.Equal(t, profiles.KindDeploy, d.Kind, d.Name)
		require.NotEmpty(t, d.Description, d.Name)
		require.NoError(t, provision.ValidateProfiles([]provision.Profile{d.Profile}), d.Name)
	}
}
