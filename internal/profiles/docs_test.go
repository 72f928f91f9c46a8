package profiles_test

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/doctest"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/profiles"
)

// section is the text of a docs/profiles.md section, from its heading to
// the next heading of the same or a higher level.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	require.GreaterOrEqual(t, i, 0, "docs/profiles.md has no section %q", heading)
	s := doc[i+len(heading)+2:]
	level := strings.SplitN(heading, " ", 2)[0]
	if j := regexp.MustCompile(`\n#{1,` + itoa(len(level)) + `} `).FindStringIndex(s); j != nil {
		s = s[:j[0]]
	}
	return s
}

func itoa(n int) string { return string(rune('0' + n)) }

// TestDocsListBuiltinsAndConstructs keeps docs/profiles.md in step with
// the code: its list of built-in profiles is exactly the shipped
// documents, it describes every step construct, in the code's order, and every
// driver operation.
func TestDocsListBuiltinsAndConstructs(t *testing.T) {
	t.Parallel()
	doc := doctest.Read(t, "docs/profiles.md")
	item := regexp.MustCompile("(?m)^- `([a-z0-9.\\-_]+)`")

	var listed []string
	for _, m := range item.FindAllStringSubmatch(section(t, doc, "## Built-in profiles"), -1) {
		listed = append(listed, m[1])
	}
	ds, err := profiles.Builtins()
	require.NoError(t, err)
	var names []string
	for _, d := range ds {
		names = append(names, d.Name)
	}
	slices.Sort(names)
	require.Equal(t, names, listed, "docs/profiles.md: the built-in profiles")

	listed = nil
	for _, m := range item.FindAllStringSubmatch(section(t, doc, "## Step constructs"), -1) {
		listed = append(listed, m[1])
	}
	require.Equal(t, append(slices.Clone(profiles.Constructs), "cleanup"), listed, "docs/profiles.md: the step constructs")

	for op := range metal.DriverOps {
		require.Contains(t, section(t, doc, "## Step constructs"), "`"+op+"`")
	}
}
