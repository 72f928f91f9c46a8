package metal_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/metal"
)

// TestSiteKindsAreFleets: the gateway refuses the site agent's kinds to any
// other mode by fleet's list, so metal's kinds must be on it.
func TestSiteKindsAreFleets(t *testing.T) {
	require.ElementsMatch(t, []string{metal.CommandBMCPower, metal.CommandBMCRotate, metal.CommandSiteMachines}, fleet.SiteCommandKinds)
}
