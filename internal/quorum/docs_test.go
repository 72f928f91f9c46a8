package quorum_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/doctest"
	"github.com/better-compute/better-compute/internal/fleet"
)

// TestDocsListDestructiveKinds keeps docs/quorum.md's table of destructive
// kinds equal to fleet.DestructiveKinds, in order, with their subjects.
func TestDocsListDestructiveKinds(t *testing.T) {
	t.Parallel()
	var got, want [][2]string
	for _, cells := range doctest.Table(t, doctest.Read(t, "docs/quorum.md"), "| kind | subject | what it destroys |") {
		require.Len(t, cells, 3)
		kinds := doctest.Code(cells[0])
		require.Len(t, kinds, 1, "row %q", cells)
		got = append(got, [2]string{kinds[0], cells[1]})
	}
	for _, d := range fleet.DestructiveKinds {
		want = append(want, [2]string{d.Kind, d.Subject})
	}
	require.Equal(t, want, got)
}
