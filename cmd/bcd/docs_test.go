package main

import (
	"flag"
	"io"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/internal/doctest"
)

// TestDocsFleetListsEveryFlag holds docs/fleet.md's bcd flag table to the
// flags bcd registers: each flag with its default, and no flag bcd lacks.
func TestDocsFleetListsEveryFlag(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("bcd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o options
	o.register(fs)
	documented := map[string]string{}
	for _, cells := range doctest.Table(t, doctest.Read(t, "docs/fleet.md"), "| flag | default | meaning |") {
		for _, c := range doctest.Code(cells[0]) {
			documented[c] = cells[1]
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		def, ok := documented["--"+f.Name]
		if !ok {
			t.Errorf("docs/fleet.md: bcd flag --%s is missing from the flag table", f.Name)
			return
		}
		want := f.DefValue
		if want == "" || want == "false" || want == "0s" {
			want = "—"
			if def != want {
				t.Errorf("docs/fleet.md: --%s has no default, the table says %q", f.Name, def)
			}
			return
		}
		if !slices.Contains(doctest.Code(def), want) {
			t.Errorf("docs/fleet.md: --%s defaults to %q, the table says %q", f.Name, want, def)
		}
	})
	for name := range documented {
		if fs.Lookup(name[2:]) == nil {
			t.Errorf("docs/fleet.md lists %s, which bcd does not have", name)
		}
	}
}
