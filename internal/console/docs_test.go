package console_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/console"
)

// TestDocsNameEveryPage: docs/console.md's table names every page the
// navigation shows, so the two cannot drift apart.
func TestDocsNameEveryPage(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/console.md")
	require.NoError(t, err)
	for _, path := range console.NavPaths() {
		require.Contains(t, string(doc), "| `"+path+"` |", "docs/console.md's table of pages names %s", path)
	}
}

// Each role's navigation: operators' pages for operators, API keys for
// admins, and the rest for everyone.
func TestNavigationByRole(t *testing.T) {
	t.Parallel()
	require.Equal(t, console.NavPaths(), console.NavPathsFor("", ""), "a platform key sees every page")
	admin := console.NavPathsFor("tnt_a", "admin")
	require.Contains(t, admin, console.PathAPIKeys)
	require.Contains(t, admin, console.PathMachines)
	member := console.NavPathsFor("tnt_a", "member")
	require.NotContains(t, member, console.PathAPIKeys)
	require.NotContains(t, member, console.PathNodes)
	require.Contains(t, member, console.PathReservations)
	require.Contains(t, member, console.PathEvents)
	require.Equal(t, member, console.NavPathsFor("tnt_a", "viewer"))
	operator := console.NavPathsFor("tnt_a", "operator")
	require.Contains(t, operator, console.PathNodes)
	require.NotContains(t, operator, console.PathAPIKeys)
}
