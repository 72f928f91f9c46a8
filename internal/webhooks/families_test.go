package webhooks_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/webhooks"
)

// TestEventFamilies: every event type the code spells as a literal
// (Type: "x.y", an event("x.y", …) helper) is of a family webhooks accept,
// so a subscription to a real type is never refused as a typo.
func TestEventFamilies(t *testing.T) {
	t.Parallel()
	// Type: "x.y" in an envelope.Event, or a helper such as
	// instanceEvent("x.y", …); not validateHealthEvent("status.events").
	lit := regexp.MustCompile(`(Type:\s*|\b[a-zA-Z]*[eE]vent\(\s*)"([a-zA-Z_]+)\.[a-z_]+(?:\.[a-z_]+)?"`)
	found := map[string]string{}
	root := filepath.Join("..")
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
			if strings.HasPrefix(m[1], "validate") {
				continue
			}
			found[m[2]] = path
		}
		return nil
	}))
	require.Contains(t, found, "reservation", "the scan finds the reservation events")
	// Events emitted through a module's helper whose type is not its first
	// argument (rollout's m.event(ctx, tx, "rollout.halted", …)) escape the
	// scan: they are listed here.
	found["rollout"] = "../rollout/module.go"
	for fam, where := range found {
		require.True(t, slices.Contains(webhooks.EventFamilies, fam), "%s emits %s.* events: add %q to webhooks.EventFamilies", where, fam, fam)
	}
}
