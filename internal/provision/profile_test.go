package provision_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/provision"
)

func goodProfile() provision.Profile {
	return provision.Profile{Name: "deploy", Steps: []provision.Step{
		{Name: "power", Kind: "power.cycle", Destructive: true, Timeout: time.Minute, Retries: 2, Backoff: time.Second},
		{Name: "rejoin", Kind: provision.KindAwaitRejoin, Timeout: 10 * time.Minute, OnFailure: "goto report"},
		{Name: "write", Kind: "image.write", Destructive: true, OnFailure: "run cleanup"},
		{Name: "report", Kind: "inventory.refresh", OnFailure: "continue"},
	}}
}

func TestProfileValidation(t *testing.T) {
	t.Parallel()
	require.NoError(t, goodProfile().Validate())

	tests := []struct {
		name  string
		edit  func(p *provision.Profile)
		field string
		want  string
	}{
		{"no name", func(p *provision.Profile) { p.Name = "" }, "name", "is required"},
		{"bad name", func(p *provision.Profile) { p.Name = "Deploy!" }, "name", "must match"},
		{"no steps", func(p *provision.Profile) { p.Steps = nil }, "steps", "at least one step"},
		{"duplicate step", func(p *provision.Profile) { p.Steps[1].Name = "power" }, "steps[1].name", "already the name of steps[0]"},
		{"no kind", func(p *provision.Profile) { p.Steps[0].Kind = "" }, "steps[0].kind", "is required"},
		{"bad kind", func(p *provision.Profile) { p.Steps[0].Kind = "Power Cycle" }, "steps[0].kind", "dotted lower-case"},
		{"destructive await", func(p *provision.Profile) { p.Steps[1].Destructive = true }, "steps[1].destructive", "cannot be destructive"},
		{"negative timeout", func(p *provision.Profile) { p.Steps[0].Timeout = -time.Second }, "steps[0].timeout", "between 0"},
		{"huge timeout", func(p *provision.Profile) { p.Steps[0].Timeout = 48 * time.Hour }, "steps[0].timeout", "between 0"},
		{"retries", func(p *provision.Profile) { p.Steps[0].Retries = 11 }, "steps[0].retries", "between 0 and 10"},
		{"backoff", func(p *provision.Profile) { p.Steps[0].Backoff = 2 * time.Hour }, "steps[0].backoff", "between 0"},
		{"on_failure word", func(p *provision.Profile) { p.Steps[0].OnFailure = "explode" }, "steps[0].on_failure", `"goto <step>"`},
		{"goto unknown", func(p *provision.Profile) { p.Steps[0].OnFailure = "goto nowhere" }, "steps[0].on_failure", "names no step"},
		{"goto backwards", func(p *provision.Profile) { p.Steps[2].OnFailure = "goto power" }, "steps[2].on_failure", "later step"},
		{"run itself", func(p *provision.Profile) { p.Steps[0].OnFailure = "run deploy" }, "steps[0].on_failure", "profile itself"},
		{"params", func(p *provision.Profile) { p.Steps[0].Params = map[string]any{"x": func() {}} }, "steps[0].params", "JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := goodProfile()
			tt.edit(&p)
			err := p.Validate()
			ee := requireCode(t, err, envelope.CodeInvalidArgument)
			found := false
			for _, v := range ee.Violations {
				if v.Field == tt.field && strings.Contains(v.Reason, tt.want) {
					found = true
				}
			}
			require.True(t, found, "want %s: %q in %+v", tt.field, tt.want, ee.Violations)
		})
	}
}

func TestValidateProfilesCrossReferences(t *testing.T) {
	t.Parallel()
	cleanup := provision.Profile{Name: "cleanup", Steps: []provision.Step{{Name: "wipe", Kind: "disk.wipe", Destructive: true}}}
	require.NoError(t, provision.ValidateProfiles([]provision.Profile{goodProfile(), cleanup}))

	ee := requireCode(t, provision.ValidateProfiles([]provision.Profile{goodProfile()}), envelope.CodeInvalidArgument)
	require.Equal(t, "profiles[0].steps[2].on_failure", ee.Violations[0].Field)
	require.Contains(t, ee.Violations[0].Reason, `run names no known profile: "cleanup"`)

	nested := cleanup
	nested.Steps = []provision.Step{{Name: "wipe", Kind: "disk.wipe", OnFailure: "run deploy"}}
	ee = requireCode(t, provision.ValidateProfiles([]provision.Profile{goodProfile(), nested}), envelope.CodeInvalidArgument)
	require.Contains(t, ee.Error(), "itself runs a cleanup")

	ee = requireCode(t, provision.ValidateProfiles([]provision.Profile{cleanup, cleanup}), envelope.CodeInvalidArgument)
	require.Equal(t, "profiles[1].name", ee.Violations[0].Field)
}

func TestParseOnFailure(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]provision.OnFailureRule{
		"":                    {Action: "fail"},
		"fail":                {Action: "fail"},
		"continue":            {Action: "continue"},
		"goto report":         {Action: "goto", Target: "report"},
		"run cleanup":         {Action: "run", Target: "cleanup"},
		"run profile cleanup": {Action: "run", Target: "cleanup"},
	} {
		got, err := provision.ParseOnFailure(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"goto", "run", "continue now", "retry"} {
		_, err := provision.ParseOnFailure(bad)
		require.Error(t, err, bad)
	}
}

func TestNewRefusesKindWithoutRunner(t *testing.T) {
	t.Parallel()
	f := setup(t, nil, nil)
	cfg := f.cfg
	cfg.Profiles = []provision.Profile{{Name: "x", Steps: []provision.Step{{Name: "a", Kind: "bios.flash"}}}}
	_, err := provision.New(cfg)
	require.ErrorContains(t, err, `no runner for kind "bios.flash"`)
}
