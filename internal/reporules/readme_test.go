package reporules

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeSection returns the README's text under heading, up to the next
// heading of the same level.
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	require.NoError(t, err)
	s := string(b)
	i := strings.Index(s, "\n"+heading+"\n")
	require.GreaterOrEqual(t, i, 0, "README has no %q", heading)
	s = s[i+len(heading)+2:]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	return s
}

// layoutNames expands the layout's entries: internal/x and
// internal/{a,b,c}, and top-level dirs (cmd/bcd/ names cmd).
func layoutNames(layout string) map[string]bool {
	names := map[string]bool{}
	brace := regexp.MustCompile(`^internal/\{([a-z0-9_,]+)\}`)
	for _, l := range strings.Split(layout, "\n") {
		for _, f := range strings.Fields(l) {
			if m := brace.FindStringSubmatch(f); m != nil {
				names["internal"] = true
				for _, n := range strings.Split(m[1], ",") {
					names["internal/"+n] = true
				}
				continue
			}
			f = strings.TrimSuffix(f, "/")
			parts := strings.Split(f, "/")
			names[parts[0]] = true
			if len(parts) >= 2 && parts[0] == "internal" {
				names["internal/"+parts[1]] = true
			}
		}
	}
	return names
}

// TestREADMELayoutNamesEveryDirectory: the README's Layout names every
// top-level directory of the repository and every module under internal/,
// so a new one cannot land unexplained.
func TestREADMELayoutNamesEveryDirectory(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	names := layoutNames(readmeSection(t, "## Layout"))
	// Not source: build output, the docs (listed under Documentation),
	// and the CI script's directory.
	skip := map[string]bool{"bin": true, "docs": true}
	var missing []string
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || skip[e.Name()] {
			continue
		}
		if !names[e.Name()] {
			missing = append(missing, e.Name()+"/")
		}
	}
	internal, err := os.ReadDir(filepath.Join(root, "internal"))
	require.NoError(t, err)
	for _, e := range internal {
		if e.IsDir() && !names["internal/"+e.Name()] {
			missing = append(missing, "internal/"+e.Name())
		}
	}
	require.Empty(t, missing, "README.md's Layout does not name these: add a line for each")
	require.True(t, layoutNames("internal/{a,b}  x\ncmd/bcd/ y")["internal/b"], "the brace form expands")
}

// TestREADMEListsEveryDoc: every page under docs/ is linked from the
// README's Documentation list, and every link there exists.
func TestREADMEListsEveryDoc(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	list := readmeSection(t, "## Documentation")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, docs)
	for _, d := range docs {
		rel := "docs/" + filepath.Base(d)
		require.Contains(t, list, "("+rel+")", "README.md's Documentation does not link %s", rel)
	}
	for _, m := range regexp.MustCompile(`\((docs/[a-z0-9_-]+\.md)\)`).FindAllStringSubmatch(list, -1) {
		_, err := os.Stat(filepath.Join(root, m[1]))
		require.NoError(t, err, "README.md links %s, which does not exist", m[1])
	}
}
