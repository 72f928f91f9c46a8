package placer_test

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/doctest"
)

// TestGangTopologiesMatchTheDocs keeps docs/capacity.md's gang section and
// the placer's list of topologies together: each topology and its node
// label are documented, and the docs name no label the placer does not read.
func TestGangTopologiesMatchTheDocs(t *testing.T) {
	doc := doctest.Read(t, "docs/capacity.md")
	gangs := doctest.Section(t, doc, "### Gangs")
	for _, name := range placer.Topologies {
		if label := "`" + placer.TopologyLabel(name) + "`"; !strings.Contains(gangs, label) {
			t.Errorf("docs/capacity.md ### Gangs does not name topology %q's label %s", name, label)
		}
	}
	for _, m := range regexp.MustCompile("`topology\\.([a-z0-9-]+)").FindAllStringSubmatch(gangs, -1) {
		if !slices.Contains(placer.Topologies, m[1]) {
			t.Errorf("docs/capacity.md ### Gangs names label topology.%s, which no topology reads", m[1])
		}
	}
	flag := "--topology " + strings.Join(placer.Topologies, "|")
	if !strings.Contains(doc, flag) {
		t.Errorf("docs/capacity.md does not show the flag as %q", flag)
	}
}
