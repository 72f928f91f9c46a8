package cli

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/better-compute/better-compute/internal/doctest"
)

// TestDocsConfigurationListsEveryFlag holds docs/configuration.md's flag
// tables for serve and dev to the flags the commands register.
func TestDocsConfigurationListsEveryFlag(t *testing.T) {
	t.Parallel()
	doc := doctest.Read(t, "docs/configuration.md")
	for _, c := range []struct {
		heading string
		flags   *pflag.FlagSet
	}{
		{"## `better-compute serve`", newServeCommand().Flags()},
		{"## `better-compute dev`", newDevCommand().Flags()},
	} {
		documented := map[string]bool{}
		for _, cells := range doctest.Table(t, doctest.Section(t, doc, c.heading), "| flag | env | default | meaning |") {
			for _, f := range doctest.Code(cells[0]) {
				documented[f] = true
			}
		}
		c.flags.VisitAll(func(f *pflag.Flag) {
			if f.Hidden || f.Name == "help" {
				return
			}
			if !documented["--"+f.Name] {
				t.Errorf("docs/configuration.md %s: flag --%s is missing from the table", c.heading, f.Name)
			}
		})
		for name := range documented {
			if name[:2] == "--" && c.flags.Lookup(name[2:]) == nil {
				t.Errorf("docs/configuration.md %s lists %s, which the command does not have", c.heading, name)
			}
		}
	}
}

// TestHelpSummaryNamesEveryCommand keeps the root --help summary, which
// groups the commands by what they are for, in step with the commands.
func TestHelpSummaryNamesEveryCommand(t *testing.T) {
	t.Parallel()
	root := NewRootCommand("test")
	words := map[string]bool{}
	for _, w := range strings.FieldsFunc(root.Long, func(r rune) bool { return r == ' ' || r == ',' || r == '\n' }) {
		words[w] = true
	}
	testOnly := map[string]bool{} // commands tests register
	for _, f := range extraCommands {
		testOnly[f().Name()] = true
	}
	for _, c := range root.Commands() {
		switch name := c.Name(); {
		case c.Hidden, name == "help", name == "completion", testOnly[name]:
		case !words[name]:
			t.Errorf("the --help summary does not name the command %q", name)
		}
	}
}
