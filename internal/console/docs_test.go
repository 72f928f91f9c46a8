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
