package placement

import (
	"slices"
	"strings"
)

// MIGProfile is one GPU instance profile a GPU model supports, and the most
// instances of it one GPU can hold.
type MIGProfile struct {
	Name         string
	MaxInstances int
}

// migLayouts lists the MIG profiles per GPU model (NVIDIA MIG user guide,
// "Supported MIG Profiles"). A model missing here does not support MIG.
var migLayouts = map[string][]MIGProfile{
	"H100 80GB": {
		{"1g.10gb", 7}, {"1g.20gb", 4}, {"2g.20gb", 3}, {"3g.40gb", 2}, {"4g.40gb", 1}, {"7g.80gb", 1},
	},
	"A100 80GB": {
		{"1g.10gb", 7}, {"1g.20gb", 4}, {"2g.20gb", 3}, {"3g.40gb", 2}, {"4g.40gb", 1}, {"7g.80gb", 1},
	},
	"A100 40GB": {
		{"1g.5gb", 7}, {"1g.10gb", 4}, {"2g.10gb", 3}, {"3g.20gb", 2}, {"4g.20gb", 1}, {"7g.40gb", 1},
	},
}

// MIGProfiles returns the MIG profiles the GPU model supports, or nil when it
// does not support MIG. The model name is matched case-insensitively.
func MIGProfiles(model string) []MIGProfile {
	for m, p := range migLayouts {
		if ModelMatches(model, m) {
			return slices.Clone(p)
		}
	}
	return nil
}

// migMax returns the most instances of profile a GPU of model can hold, or 0
// when the model does not support that profile.
func migMax(model, profile string) int {
	for m, ps := range migLayouts {
		if !ModelMatches(model, m) {
			continue
		}
		for _, p := range ps {
			if p.Name == profile {
				return p.MaxInstances
			}
		}
	}
	return 0
}

// migProfileKnown reports whether any model in the table supports profile.
func migProfileKnown(profile string) bool {
	for _, ps := range migLayouts {
		for _, p := range ps {
			if p.Name == profile {
				return true
			}
		}
	}
	return false
}

// ModelMatches reports whether a GPU of model have satisfies a request for
// model want: the same name, or want is its first word ("H100" matches
// "H100 80GB"). Case does not matter.
func ModelMatches(want, have string) bool {
	if strings.EqualFold(want, have) {
		return true
	}
	return len(have) > len(want) && have[len(want)] == ' ' && strings.EqualFold(want, have[:len(want)])
}
