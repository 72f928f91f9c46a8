package reporules

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
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

// docSection returns a doc's text under heading, up to the next heading
// of the same or a higher level.
func docSection(t *testing.T, doc, heading string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), doc))
	require.NoError(t, err)
	s := string(b)
	i := strings.Index(s, "\n"+heading+"\n")
	require.GreaterOrEqual(t, i, 0, "%s has no %q", doc, heading)
	s = s[i+len(heading)+2:]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	return s
}

// TestArchitectureListsEveryJob: every River job kind the code registers
// has a row in docs/architecture.md's Background work table.
func TestArchitectureListsEveryJob(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	table := docSection(t, "docs/architecture.md", "## Background work")
	kindRE := regexp.MustCompile(`Kind\(\) string\s*\{\s*return "([a-z_]+\.[a-z_.]+)"`)
	var missing []string
	require.NoError(t, filepath.WalkDir(filepath.Join(root, "internal"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range kindRE.FindAllStringSubmatch(string(b), -1) {
			if !strings.Contains(table, "`"+m[1]+"`") {
				missing = append(missing, m[1])
			}
		}
		return nil
	}))
	require.Empty(t, missing, "docs/architecture.md's Background work table lacks these job kinds")
}

// TestArchitectureNamesEveryModule: the parts table of docs/architecture.md
// names every module under internal/ (as internal/x, or inside
// internal/{a,b}), and the not-built list names no module as missing that
// exists.
func TestArchitectureNamesEveryModule(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	parts := docSection(t, "docs/architecture.md", "## The parts")
	names := layoutNames(strings.NewReplacer("`", " ", "|", " ", ",", " ").Replace(parts))
	// internal/{a,b} is written with commas inside the braces, which the
	// replacer above split: read those forms from the raw text too.
	for k := range layoutNames(strings.NewReplacer("`", " ", "|", " ").Replace(parts)) {
		names[k] = true
	}
	entries, err := os.ReadDir(filepath.Join(root, "internal"))
	require.NoError(t, err)
	var missing []string
	for _, e := range entries {
		if e.IsDir() && !names["internal/"+e.Name()] && !strings.Contains(parts, "internal/"+e.Name()) {
			missing = append(missing, "internal/"+e.Name())
		}
	}
	// Repository tooling, not parts of the running system.
	missing = slices.DeleteFunc(missing, func(s string) bool { return s == "internal/reporules" || s == "internal/doctest" })
	require.Empty(t, missing, "docs/architecture.md's parts table does not name these modules")
	notBuilt := docSection(t, "docs/architecture.md", "## What is not built yet")
	for _, m := range regexp.MustCompile("`((?:internal|deploy|cmd|pkg)/[a-z0-9_/]+)`").FindAllStringSubmatch(notBuilt, -1) {
		_, err := os.Stat(filepath.Join(root, m[1]))
		require.Error(t, err, "the not-built list names %s, which exists", m[1])
	}
}
