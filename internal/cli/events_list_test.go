package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEventsList(t *testing.T) {
	t.Parallel()
	b := setup(t)

	out := b.ok(t, "events", "list", "--tenant", "acme")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	require.Equal(t, []string{"ID", "TIME", "TYPE", "RESOURCE", "TENANT"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"2", "2025-01-02T03:04:05Z", "project.created", "Project/prj_1", "ten_1"}, strings.Fields(lines[1]), "newest first")

	out = b.ok(t, "events", "list", "--type", "project.", "--resource-type", "Project", "--resource-id", "prj_1", "-o", "json")
	var resp struct {
		Events []struct{ ID, Type string }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &resp))
	require.Len(t, resp.Events, 1)
	require.Equal(t, "project.created", resp.Events[0].Type)

	// --limit stops after a page and says how to continue.
	r := b.run(t, "", "events", "list", "--limit", "1")
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, strings.Split(strings.TrimSpace(r.stdout), "\n"), 2)
	require.Contains(t, r.stderr, "more events: continue with --page-token 1")
	r = b.run(t, "", "events", "list", "--page-token", "1")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "tenant.created")
	require.NotContains(t, r.stdout, "project.created")

	// Bad flags name themselves.
	for flag, argv := range map[string][]string{
		"--since": {"--since", "yesterday"},
		"--until": {"--until", "-1x"},
		"--limit": {"--limit", "-1"},
	} {
		r := b.run(t, "", append([]string{"events", "list"}, argv...)...)
		require.Equal(t, 1, r.code, "%s: %s", flag, r.stderr)
		require.Contains(t, r.stderr, "INVALID_ARGUMENT")
		require.Contains(t, r.stderr, flag)
	}
}
